"""Which loss the training derivation appends to a forward graph (`--loss`).

A graph that ends in its own ONNX `SoftmaxCrossEntropyLoss` keeps it. Otherwise the loss goes
on the graph's first float output, and `--loss` says which:

- ``auto`` (the default) reads the output's shape:

  =========================  ===================================  ==========================
  output                     loss                                 labels
  =========================  ===================================  ==========================
  (N, C), C >= 2             softmax cross-entropy over C         (N,) int64
  (N, T, V), V >= 2          over the last axis (sequence models) (N, T)
  (N, C, L) made by a Conv   over axis 1 (channel-first)          (N, L)
  (N, C, D1, ..., Dk), C>=2  over axis 1, per position            (N, D1..Dk), trailing 1s
                                                                  dropped: (N, C, 1, 1)
                                                                  takes (N,)
  anything else              refused: no meaningful class axis
  =========================  ===================================  ==========================

  "Anything else" is a scalar or (N,) output, a class axis of size 1 ((N, 1) click scores,
  (N, 1, H, W) masks) and (N, T, 1): softmax over one class is constant, so such a loss and
  every gradient would be exactly zero. The error names the output, its shape and the fix.
- ``ce-axis1``: softmax cross-entropy with classes on axis 1 (N x C x ...), labels as above.
- ``ce-last``: softmax cross-entropy with classes on the last axis (N x ... x C: language
  models, channels-last images); labels are the output's shape without its last axis.
- ``mse``: mean squared error against a float target of the output's shape (regression,
  single-logit and single-channel outputs); any float output.

A class axis of size 1 is refused for ``ce-axis1`` and ``ce-last`` too. Where the class axis is
the output's last axis, the kernel is emitted with ``axis=-1`` whichever rule chose it, so a
classifier's training graph (and its profile signatures) does not depend on the spelling.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotm_py.errors import ConfigError

LOSSES = ("auto", "ce-axis1", "ce-last", "mse")
CHANNEL_FIRST_OPS = frozenset({"Conv", "ConvRelu", "ConvTranspose"})


@dataclass(frozen=True)
class LossChoice:
    """The loss kernel to append: op type, attributes and the labels (or target) tensor."""

    op_type: str  # "SoftmaxCrossEntropy" | "MeanSquaredError"
    attrs: dict[str, object]
    labels_shape: tuple[int, ...]
    labels_dtype: str


def choose_loss(loss: str, name: str, shape: tuple[int, ...], dtype: str,
                producer_op: str | None = None) -> LossChoice:
    """The loss for output `name` of `shape`/`dtype` (made by `producer_op`) under `loss`."""
    if loss not in LOSSES:
        raise ConfigError(f"loss {loss!r} is not supported; use one of {', '.join(LOSSES)}")
    if loss == "mse":
        return LossChoice("MeanSquaredError", {}, tuple(shape), dtype)
    axis = _class_axis(loss, shape, producer_op)
    if axis is None or shape[axis] < 2:
        raise ConfigError(_refusal(loss, name, shape, axis))
    axis %= len(shape)
    labels = tuple(d for i, d in enumerate(shape) if i != axis)
    if axis == 1 and len(shape) > 2:  # (N, C, 1, 1) -> (N,): drop trailing singleton positions
        while len(labels) > 1 and labels[-1] == 1:
            labels = labels[:-1]
    attrs = {"axis": -1 if axis == len(shape) - 1 else axis, "reduction": "mean",
             "ignore_index": None}
    return LossChoice("SoftmaxCrossEntropy", attrs, labels, "int64")


def _class_axis(loss: str, shape: tuple[int, ...], producer_op: str | None) -> int | None:
    """The class axis that `loss` picks for `shape`, or None where there is none."""
    if len(shape) < 2:
        return None
    if loss == "ce-last":
        return len(shape) - 1
    if loss == "ce-axis1" or len(shape) == 2 or len(shape) > 3:
        return 1
    # rank 3: (N, T, V) of sequence models, unless a convolution made it (N, C, L)
    return 1 if producer_op in CHANNEL_FIRST_OPS else 2


def _refusal(loss: str, name: str, shape: tuple[int, ...], axis: int | None) -> str:
    dims = "x".join(str(d) for d in shape) or "scalar"
    if axis is None:
        why = "it has no class axis"
    else:
        why = f"its class axis {axis} has size {shape[axis]}, so softmax over it is constant " \
              "and every gradient would be zero"
    fixes = "--loss mse for a regression target"
    if len(shape) >= 3:
        fixes += ", --loss ce-axis1 or --loss ce-last to name the class axis"
    return (f"cannot put a softmax cross-entropy loss on output {name!r} of shape {dims} "
            f"(--loss {loss}): {why}; use {fixes}, or give the model its own "
            "SoftmaxCrossEntropyLoss")
