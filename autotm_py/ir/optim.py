"""The optimizer a training graph updates its weights with: `Optimizer`, a frozen value with a
PyTorch user's hyper-parameters, and the update kernels `derive_training` emits for it.

`Optimizer(kind, lr, momentum=0.0, dampening=0.0, nesterov=False, weight_decay=0.0,
betas=(0.9, 0.999), eps=1e-8, lr_input=False)`, where `kind` is "sgd" (torch.optim.SGD),
"adam" (torch.optim.Adam, L2 weight decay added to the gradient) or "adamw" (torch.optim.AdamW,
decoupled weight decay). Only what the kernels compute as torch does is a field: amsgrad,
maximize, differentiable, fused and the like are not (a caller that reads a torch optimizer
refuses them). `derive_training(graph, optimizer="sgd" | "adam" | Optimizer(...))`: the two
strings are `Optimizer(kind, lr=learning_rate)` and give the graphs they always gave.

The update kernels (op table: `ir/rules/__init__.py`, kernels: `kernels/grad_tensor.py`), one
per trained weight, in weight order:

- `SGDUpdate` W, dW[, buf][, lr] -> W'[, buf']: a plain SGD (no momentum, no weight decay) is
  today's two-input kernel; `weight_decay` adds wd * W to the gradient first; `momentum` (and
  `nesterov`) carries a momentum buffer `sgd::momentum::<W>` (OPTIMIZER_STATE, zero at the
  start, paired with its `::next` in `carried`), in torch.optim.SGD's order of operations;
- `AdamStep` step[, lr] -> step', coef once, then `AdamUpdate` W, dW, m, v, coef[, lr] ->
  W', m', v' per weight (Adam's capturable form: the bias corrections on the device);
  `weight_decay` (L2, added to the gradient) or, with `decoupled_weight_decay` (AdamW),
  W * (1 - lr * wd) first.

`lr_input=True`: the learning rate is a float32 scalar CONSTANT `optimizer::lr` (its value in
`graph.constants`, its id in `graph.meta["training"]["lr_tensor"]`), the last input of every
kernel that uses it (`SGDUpdate`, `AdamStep`, AdamW's `AdamUpdate`) in place of the `lr`
attribute: a scheduler changes it between iterations by giving that tensor a new value, and
the graph stays the same. Plain Adam's `AdamUpdate` does not read it: `coef` holds it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real
from typing import TYPE_CHECKING, Any

from autotm_py.errors import ConfigError
from autotm_py.ir.graph import Role

if TYPE_CHECKING:
    from autotm_py.ir.graph import Kernel
    from autotm_py.ir.rules.base import Tape

OPTIMIZER_KINDS = ("sgd", "adam", "adamw")
OPTIMIZERS = ("sgd", "adam")  # the string forms (the CLI's --optimizer)
DEFAULT_LEARNING_RATE = 0.01  # derive_training's, for the string forms
LR_TENSOR = "optimizer::lr"
_SGD_ONLY = ("momentum", "dampening", "nesterov")
_NUMBERS = ("lr", "momentum", "dampening", "weight_decay", "eps")


@dataclass(frozen=True)
class Optimizer:
    """An optimizer and its hyper-parameters (module docstring), checked when made: a
    `ConfigError` names the field and what is supported."""

    kind: str
    lr: float
    momentum: float = 0.0
    dampening: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    lr_input: bool = False

    def __post_init__(self) -> None:
        if self.kind not in OPTIMIZER_KINDS:
            raise ConfigError(f"Optimizer kind {self.kind!r} is not supported; use one of "
                              f"{', '.join(OPTIMIZER_KINDS)}")
        for name in _NUMBERS:
            object.__setattr__(self, name, _number(name, getattr(self, name)))
        betas = self.betas
        if not isinstance(betas, tuple | list) or len(betas) != 2:
            raise ConfigError(f"Optimizer betas={betas!r}: expected two numbers (beta1, beta2)")
        object.__setattr__(self, "betas", tuple(_number(f"betas[{i}]", b)
                                                for i, b in enumerate(betas)))
        for name in ("nesterov", "lr_input"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"Optimizer {name}={getattr(self, name)!r}: expected True or "
                                  "False")
        _check_values(self)

    @property
    def decoupled(self) -> bool:
        """AdamW: the weight decay multiplies the weight instead of joining the gradient."""
        return self.kind == "adamw"

    @property
    def is_adam(self) -> bool:
        return self.kind in ("adam", "adamw")

    def meta(self) -> dict[str, Any]:
        """What `graph.meta["training"]` records of it (`optimizer_of` reads it back). The
        string forms' entries are what they always were: `optimizer` ("sgd" or "adam";
        AdamW is Adam with `decoupled_weight_decay`, as torch 2.x's Adam has it),
        `learning_rate`, and for Adam `beta1`, `beta2`, `epsilon`; the others only where
        they are set (`lr_tensor` is added by `derive_training`)."""
        out: dict[str, Any] = {"optimizer": "adam" if self.is_adam else "sgd",
                               "learning_rate": self.lr}
        if self.is_adam:
            out.update(beta1=self.betas[0], beta2=self.betas[1], epsilon=self.eps)
        if self.momentum:
            out["momentum"] = self.momentum
        if self.nesterov:
            out["nesterov"] = True
        if self.weight_decay:
            out["weight_decay"] = self.weight_decay
        if self.decoupled:
            out["decoupled_weight_decay"] = True
        return out


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or \
            not math.isfinite(float(value)):
        raise ConfigError(f"Optimizer {name}={value!r}: expected a finite number")
    if float(value) < 0:
        raise ConfigError(f"Optimizer {name}={value!r}: must not be negative")
    return value if isinstance(value, int | float) else float(value)  # type: ignore[return-value]


def _check_values(opt: Optimizer) -> None:
    """The combinations torch refuses, and the ones whose numbers would differ from torch's."""
    for i, beta in enumerate(opt.betas):
        if not beta < 1:
            raise ConfigError(f"Optimizer betas[{i}]={beta!r}: must be in [0, 1), as in torch")
    if opt.is_adam:
        given = [f for f in _SGD_ONLY if getattr(opt, f)]
        if given:
            raise ConfigError(f"Optimizer {', '.join(given)}: {opt.kind} has no such "
                              "hyper-parameter; momentum, dampening and nesterov apply to sgd")
        return
    if opt.betas != (0.9, 0.999) or opt.eps != 1e-8:
        raise ConfigError("Optimizer betas and eps apply to adam and adamw, not to sgd; leave "
                          "them at their defaults")
    if opt.momentum and opt.dampening:
        raise ConfigError(
            f"Optimizer dampening={opt.dampening!r} with momentum={opt.momentum!r} is not "
            "supported: torch.optim.SGD's first step takes the gradient undamped (the buffer "
            "starts as the gradient), while the graph starts the momentum buffer at zero, "
            "which equals torch's first step only when dampening is 0; use dampening=0")
    if opt.nesterov and not (opt.momentum and not opt.dampening):
        raise ConfigError("Optimizer nesterov=True needs momentum > 0 and dampening 0 (as "
                          "torch.optim.SGD)")


def resolve(optimizer: str | Optimizer, learning_rate: float | None) -> Optimizer:
    """`derive_training`'s optimizer: an `Optimizer` as given (`learning_rate` then unset or
    equal to its lr), or a string of `OPTIMIZERS` with `learning_rate` (default 0.01)."""
    if isinstance(optimizer, Optimizer):
        if learning_rate is not None and learning_rate != optimizer.lr:
            raise ConfigError(f"learning rate {learning_rate!r} differs from the Optimizer's lr "
                              f"{optimizer.lr!r}; give the learning rate in the Optimizer only")
        return optimizer
    if optimizer not in OPTIMIZERS:
        raise ConfigError(f"optimizer {optimizer!r} is not supported; use one of "
                          f"{', '.join(OPTIMIZERS)} (or an autotm_py.ir.Optimizer: adamw, "
                          "momentum, weight decay)")
    lr = DEFAULT_LEARNING_RATE if learning_rate is None else learning_rate
    if not (math.isfinite(lr) and lr > 0):
        raise ConfigError(f"learning rate {lr!r} must be a positive number")
    return Optimizer(optimizer, lr)


def optimizer_of(meta: dict[str, Any]) -> Optimizer:
    """The `Optimizer` a training graph was derived with, from `graph.meta["training"]`."""
    kind = "adamw" if meta.get("decoupled_weight_decay") else str(meta["optimizer"])
    adam = kind != "sgd"
    return Optimizer(
        kind, meta["learning_rate"], momentum=meta.get("momentum", 0.0),
        nesterov=bool(meta.get("nesterov", False)), weight_decay=meta.get("weight_decay", 0.0),
        betas=(meta["beta1"], meta["beta2"]) if adam else (0.9, 0.999),
        eps=meta["epsilon"] if adam else 1e-8, lr_input="lr_tensor" in meta)


def plain_sgd(kernel: Kernel) -> bool:
    """Whether `kernel` is today's SGDUpdate: W, dW -> W - lr * dW, lr an attribute."""
    return kernel.op_type == "SGDUpdate" and len(kernel.inputs) == 2 and \
        kernel.attr("lr") is not None and not kernel.attr("momentum", 0) and \
        not kernel.attr("weight_decay", 0)


# ---- the update kernels ----------------------------------------------------------------------
def optimizer_updates(tape: Tape, weight_grads: dict[int, int], opt: Optimizer) -> int | None:
    """One update kernel per trained weight, in weight order (module docstring); Adam first
    bumps its step and computes the step's two bias-correction coefficients once
    (`AdamStep`), so each `AdamUpdate` is only elementwise work on its weight. Returns the
    learning-rate tensor (lr_input), else None."""
    if not weight_grads:
        return None
    lr = tape.new_tensor(LR_TENSOR, (), "float32", Role.CONSTANT) if opt.lr_input else None
    lr_in = [] if lr is None else [lr]
    lr_attr = {} if lr is not None else {"lr": opt.lr}
    adam = {"beta1": opt.betas[0], "beta2": opt.betas[1], "epsilon": opt.eps}
    coef = None
    if opt.is_adam:
        step = tape.new_tensor("adam::step", (), "float32", Role.OPTIMIZER_STATE)
        step_next = tape.new_tensor("adam::step::next", (), "float32", Role.OPTIMIZER_STATE)
        coef = tape.new_tensor("adam::coef", (2,), "float32", Role.ACTIVATION)
        tape.emit("AdamStep", [step, *lr_in], [step_next, coef], "adam/step", **lr_attr, **adam)
        tape.carried.append((step, step_next))
    decay = {"weight_decay": opt.weight_decay} if opt.weight_decay else {}
    for w, g in sorted(weight_grads.items()):
        t = tape.tensors[w]
        w_next = tape.new_tensor(f"{t.name}::next", t.shape, t.dtype, Role.WEIGHT)
        tape.carried.append((w, w_next))
        if coef is None:
            _sgd_update(tape, opt, w, g, w_next, lr_in, {**lr_attr, **decay})
            continue
        (m, m_next), (v, v_next) = (_state(tape, w, f"adam::{which}") for which in ("m", "v"))
        decoupled = opt.decoupled and opt.weight_decay
        attrs = {**lr_attr, **adam, **decay, **({"decoupled_weight_decay": 1} if decoupled
                                                 else {})}
        tape.emit("AdamUpdate", [w, g, m, v, coef, *(lr_in if decoupled else [])],
                  [w_next, m_next, v_next], f"adam/{t.name}", **attrs)
    return lr


def _state(tape: Tape, w: int, prefix: str) -> tuple[int, int]:
    """A per-weight optimizer state tensor (zero at the start) and its next value, carried."""
    t = tape.tensors[w]
    s = tape.new_tensor(f"{prefix}::{t.name}", t.shape, t.dtype, Role.OPTIMIZER_STATE)
    s_next = tape.new_tensor(f"{prefix}::{t.name}::next", t.shape, t.dtype,
                             Role.OPTIMIZER_STATE)
    tape.carried.append((s, s_next))
    return s, s_next


def _sgd_update(tape: Tape, opt: Optimizer, w: int, g: int, w_next: int, lr_in: list[int],
                attrs: dict[str, Any]) -> None:
    name = f"sgd/{tape.name(w)}"
    if not opt.momentum:
        tape.emit("SGDUpdate", [w, g, *lr_in], [w_next], name, **attrs)
        return
    buf, buf_next = _state(tape, w, "sgd::momentum")
    attrs["momentum"] = opt.momentum
    if opt.nesterov:
        attrs["nesterov"] = 1
    tape.emit("SGDUpdate", [w, g, buf, *lr_in], [w_next, buf_next], name, **attrs)


__all__ = ["LR_TENSOR", "OPTIMIZERS", "OPTIMIZER_KINDS", "Optimizer", "optimizer_of",
           "optimizer_updates", "plain_sgd", "resolve"]
