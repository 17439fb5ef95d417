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

An output made by a final ``Softmax`` or ``LogSoftmax`` (`final_softmax`: directly, or through
Reshape/Flatten/Squeeze/Unsqueeze/Identity/Transpose, as opsets before 13 lower a softmax over
axis 1) holds probabilities (log-probabilities): softmax cross-entropy on them cannot be right
(the loss stays near ln(C), the gradients vanish). Where that op's rows are the rows of the
loss's class axis (`FinalSoftmax.out_axis`), the derivation drops it and trains on its input,
the logits (`ir/training.py`): exact, since cross-entropy on logits is what the model's softmax
means, and log-softmax's input has the same softmax. Otherwise a Softmax is refused
(`probabilities_refusal`); a LogSoftmax is kept (cross-entropy on log-probabilities is an NLL).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autotm_py.errors import ConfigError
from autotm_py.ir.graph import TensorGraph

LOSSES = ("auto", "ce-axis1", "ce-last", "mse")
CHANNEL_FIRST_OPS = frozenset({"Conv", "ConvRelu", "ConvTranspose"})
# ops that move elements without changing them: a softmax's rows stay rows of one axis through
# them where the shapes allow (`_follow`); the reshaping ones keep the row-major order
MOVING_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Transpose"})
PROBABILITY_OPS = frozenset({"Softmax", "LogSoftmax"})


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


# ---- outputs that are probabilities ---------------------------------------------------------
@dataclass(frozen=True)
class FinalSoftmax:
    """A Softmax or LogSoftmax whose output reaches a graph output through `MOVING_OPS`."""

    kernel: int  # its kernel id
    op_type: str  # "Softmax" | "LogSoftmax"
    name: str  # its kernel name
    axis: int  # its axis, >= 0, on `logits`
    logits: int  # its input tensor
    probs: int  # its output tensor
    chain: tuple[int, ...]  # the moving kernels after it, in execution order
    private: bool  # nothing but the chain reads `probs` and what the chain makes from it
    out_axis: int | None  # the axis of the output whose rows are its rows; None: mixed


def final_softmax(graph: TensorGraph, output: int) -> FinalSoftmax | None:
    """The Softmax/LogSoftmax that makes graph output `output`, directly or through
    `MOVING_OPS`; None where another op makes it."""
    chain: list[int] = []
    t = output
    while True:
        pid = graph.tensors[t].producer
        if pid is None or graph.kernels[pid].domain != "":
            return None
        k = graph.kernels[pid]
        if k.op_type in PROBABILITY_OPS:
            break
        if k.op_type not in MOVING_OPS or not k.inputs:
            return None
        chain.append(pid)
        t = k.inputs[0]
    chain.reverse()
    x, probs = k.inputs[0], k.outputs[0]
    # each tensor from the probabilities on is read by the next chain kernel only, and the
    # output by nobody: dropping the softmax then changes no other reader
    readers = [*chain, None]
    made = [probs, *(graph.kernels[c].outputs[0] for c in chain)]
    private = all(graph.tensors[m].users == (() if r is None else (r,))
                  for m, r in zip(made, readers, strict=True))
    rank = len(graph.tensors[x].shape)
    axis = int(k.attr("axis", -1)) % rank if rank else 0
    out_axis: int | None = axis
    for c in chain:
        ck = graph.kernels[c]
        out_axis = _follow(ck.op_type, ck.attr("perm"), graph.tensors[ck.inputs[0]].shape,
                           graph.tensors[ck.outputs[0]].shape, out_axis)
    return FinalSoftmax(k.id, k.op_type, k.name, axis, x, probs, tuple(chain), private,
                        out_axis)


def _rows(shape: tuple[int, ...], axis: int) -> tuple[int, int, int]:
    """(elements before, classes, elements after) of a softmax over `axis` of `shape`."""
    return math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])


def _follow(op: str, perm: tuple[int, ...] | None, before: tuple[int, ...],
            after: tuple[int, ...], axis: int | None) -> int | None:
    """The axis of `after` along which a softmax over `axis` of `before` runs once `op` has
    moved the elements; None where its rows are no longer one axis. A Transpose moves the
    axis; the reshaping ops keep the row-major order, so the softmax's rows are rows of
    `after` where its axis splits the elements into the same (before, classes, after)."""
    if axis is None:
        return None
    if op == "Transpose":
        return tuple(perm or reversed(range(len(before)))).index(axis)
    rows = _rows(before, axis)
    return next((c for c in range(len(after)) if _rows(after, c) == rows), None)


def probabilities_refusal(loss: str, name: str, shape: tuple[int, ...], found: FinalSoftmax,
                          graph: TensorGraph, class_axis: int, other: str | None) -> str:
    """The one-line refusal of a cross-entropy on probabilities the derivation cannot drop:
    why, and the fixes (`other`: a --loss whose class axis is the softmax's, if one is)."""
    logits = graph.tensors[found.logits]
    dims = "x".join(str(d) for d in logits.shape) or "scalar"
    if not found.private:
        why = "which other kernels also read, so it cannot be dropped to train on the logits"
    else:
        why = (f"over axis {found.axis} of {logits.name!r} (shape {dims}), not over the "
               f"loss's class axis {class_axis % len(shape)}")
    fixes = "" if other is None else f"use --loss {other} (classes on the Softmax's axis), "
    out = "x".join(str(d) for d in shape)
    return (f"cannot put a softmax cross-entropy loss on output {name!r} of shape {out} "
            f"(--loss {loss}): it holds the probabilities of {found.op_type} {found.name!r} "
            f"{why}; cross-entropy on probabilities cannot be right (the loss stays near ln(C) "
            f"and its gradients vanish); {fixes}export the model without its final "
            f"{found.op_type}, or use --loss mse")
