"""What the Trainer reads from a user's torch objects: the optimizer's hyper-parameters, the
loss the training graph must compute, and the example batch's inputs and labels.

- Optimizers: `torch.optim.SGD` (momentum, nesterov, weight decay; dampening 0), `Adam` and
  `AdamW` (betas, eps, weight decay), one parameter group holding every trainable parameter
  the module's forward uses, no `maximize`, `amsgrad` or differentiable options. The learning
  rate becomes a tensor the Trainer refreshes from `param_groups[0]["lr"]` before each step,
  so a scheduler takes effect without re-planning.
- Losses are recognised by their value on the example batch, so `F.cross_entropy`,
  `nn.CrossEntropyLoss()`, a lambda that flattens a language model's logits and `F.mse_loss`
  all work: the loss function's value is compared with softmax cross-entropy over axis 1,
  over the last axis, and the mean squared error, each with mean reduction, on the module's
  own output; the first that matches (relative 1e-5) is the graph's loss (`--loss ce-axis1`,
  `ce-last`, `mse`). Anything else is an error that names what is supported.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from autotm_py.errors import ConfigError
from autotm_py.ir import Optimizer

SUPPORTED_OPTIMIZERS = "torch.optim.SGD, torch.optim.Adam and torch.optim.AdamW"
SUPPORTED_LOSSES = ("softmax cross-entropy (F.cross_entropy, nn.CrossEntropyLoss, on the class "
                    "axis 1 or the last axis) or the mean squared error (F.mse_loss, "
                    "nn.MSELoss), with mean reduction")
LOSS_RTOL = 1e-5


@dataclass(frozen=True)
class Example:
    """The example batch: the module's inputs (in its forward's order) and the labels."""

    inputs: tuple[torch.Tensor, ...]
    labels: torch.Tensor


def split_example(example: Any) -> Example:
    """`(x, y)` or `((x1, x2, ...), y)`: the inputs the module is called with, and the labels."""
    if not isinstance(example, tuple | list) or len(example) != 2:
        raise ConfigError("example: give (inputs, labels), e.g. example=(x, y) or "
                          "example=((x1, x2), y), one batch as the loader yields it")
    inputs, labels = example
    inputs = tuple(inputs) if isinstance(inputs, tuple | list) else (inputs,)
    for i, value in enumerate((*inputs, labels)):
        if not isinstance(value, torch.Tensor):
            raise ConfigError(f"example item {i} is a {type(value).__name__}: give tensors "
                              "(the batch as the loader yields it)")
    return Example(tuple(t.detach().cpu() for t in inputs), labels.detach().cpu())


def optimizer_of(optimizer: Any, params: Sequence[torch.nn.Parameter]) -> Optimizer:
    """The graph's optimizer for a torch optimizer over `params` (the module's trainable
    parameters), its learning rate an input tensor (`lr_input`)."""
    kind = {torch.optim.SGD: "sgd", torch.optim.Adam: "adam",
            torch.optim.AdamW: "adamw"}.get(type(optimizer))
    if kind is None:
        raise ConfigError(f"optimizer {type(optimizer).__name__} is not supported: use "
                          f"{SUPPORTED_OPTIMIZERS}")
    group = _one_group(optimizer, params)
    _refuse_flags(group, kind)
    if kind == "sgd":
        return Optimizer("sgd", lr=float(group["lr"]), momentum=float(group["momentum"]),
                         dampening=float(group["dampening"]), nesterov=bool(group["nesterov"]),
                         weight_decay=float(group["weight_decay"]), lr_input=True)
    beta1, beta2 = (float(b) for b in group["betas"])
    return Optimizer(kind, lr=float(group["lr"]), betas=(beta1, beta2), eps=float(group["eps"]),
                     weight_decay=float(group["weight_decay"]), lr_input=True)


def _one_group(optimizer: Any, params: Sequence[torch.nn.Parameter]) -> dict[str, Any]:
    if len(optimizer.param_groups) != 1:
        raise ConfigError(f"optimizer: {len(optimizer.param_groups)} parameter groups; the "
                          "Trainer takes one group with every trainable parameter of the module")
    group = optimizer.param_groups[0]
    given = {id(p) for p in group["params"]}
    wanted = {id(p) for p in params}
    if given != wanted:
        missing = len(wanted - given)
        extra = len(given - wanted)
        raise ConfigError(f"optimizer: its parameters are not the module's trainable ones "
                          f"({missing} of the module's missing, {extra} others); build it with "
                          "torch.optim.X(model.parameters(), ...)")
    return group


def _refuse_flags(group: dict[str, Any], kind: str) -> None:
    for flag in ("maximize", "amsgrad", "differentiable"):
        if group.get(flag):
            raise ConfigError(f"optimizer: {flag}=True is not supported ({kind}); the Trainer "
                              "runs the plain update")
    if isinstance(group["lr"], torch.Tensor):
        raise ConfigError("optimizer: give the learning rate as a number (a tensor lr is not "
                          "supported); a scheduler may change it between steps")


def loss_rule(loss_fn: Callable[..., Any], output: torch.Tensor, labels: torch.Tensor) -> str:
    """The `--loss` rule whose value equals `loss_fn(output, labels)` on the example batch."""
    with torch.no_grad():
        want = loss_fn(output, labels)
        if not isinstance(want, torch.Tensor) or want.numel() != 1:
            raise ConfigError(f"loss_fn returned {type(want).__name__} "
                              f"{getattr(want, 'shape', '')}: give a loss with mean reduction "
                              f"(a scalar); supported: {SUPPORTED_LOSSES}")
        for rule, value in _candidates(output.float(), labels):
            if value is not None and torch.allclose(value, want.float(), rtol=LOSS_RTOL,
                                                     atol=0.0):
                return rule
    raise ConfigError(f"loss_fn: its value on the example batch ({float(want):.6g}) is none "
                      f"of the losses the Trainer derives: {SUPPORTED_LOSSES}")


def _candidates(output: torch.Tensor, labels: torch.Tensor):
    """(rule, the loss it computes on this output and labels, None where it does not apply)."""
    functional = torch.nn.functional
    integer = not labels.is_floating_point()
    yield "ce-axis1", _try(lambda: functional.cross_entropy(output, labels)) \
        if integer and output.dim() >= 2 else None
    yield "ce-last", _try(lambda: functional.cross_entropy(
        output.flatten(0, -2), labels.flatten())) if integer and output.dim() >= 2 else None
    yield "mse", _try(lambda: functional.mse_loss(output, labels.to(output.dtype))) \
        if labels.shape == output.shape else None


def _try(compute: Callable[[], torch.Tensor]) -> torch.Tensor | None:
    try:
        return compute()
    except (RuntimeError, ValueError, IndexError):
        return None
