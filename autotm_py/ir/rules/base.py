"""The pieces a training rule works with: mutable drafts of tensors and kernels, and `Tape`.

The derivation (`ir/training.py`) copies the forward graph into drafts, lets each op's rule
rewrite its forward kernel for training (`prepare`) and append backward kernels (`backward`),
then freezes everything through `GraphBuilder`. Drafts are mutable only during derivation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from autotm_py.ir.graph import Role

BACKWARD_DOMAIN = "autotm"
FLOAT_DTYPES = frozenset({"float64", "float32", "float16", "bfloat16"})


@dataclass
class TensorDraft:
    name: str
    shape: tuple[int, ...]
    dtype: str
    role: Role


@dataclass
class KernelDraft:
    name: str
    op_type: str
    domain: str
    attrs: dict[str, Any]
    inputs: list[int]
    outputs: list[int]
    workspace_bytes: int = 0

    def attr(self, name: str, default: Any = None) -> Any:
        value = self.attrs.get(name, default)
        return default if value is None else value


@dataclass
class Tape:
    """The drafts of the training graph being built, and helpers for the rules.

    Rules call `shape`/`dtype` to read tensors, `new_grad` to make the gradient tensor of an
    input slot, `new_tensor` for extra forward outputs, and `emit` to append a backward kernel.
    """

    tensors: list[TensorDraft]
    kernels: list[KernelDraft]
    carried: list[tuple[int, int]] = field(default_factory=list)
    expected: dict[int, int] = field(default_factory=dict)  # partial gradients per tensor
    _names: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self._names = {t.name for t in self.tensors}

    def shape(self, tid: int) -> tuple[int, ...]:
        return self.tensors[tid].shape

    def dtype(self, tid: int) -> str:
        return self.tensors[tid].dtype

    def name(self, tid: int) -> str:
        return self.tensors[tid].name

    def unique(self, name: str) -> str:
        if name not in self._names:
            return name
        i = 2
        while f"{name}#{i}" in self._names:
            i += 1
        return f"{name}#{i}"

    def new_tensor(self, name: str, shape: Sequence[int], dtype: str, role: Role) -> int:
        name = self.unique(name)
        self._names.add(name)
        self.tensors.append(TensorDraft(name, tuple(int(d) for d in shape), dtype, role))
        return len(self.tensors) - 1

    def rename(self, tid: int, name: str) -> None:
        """Give tensor `tid` the name `name` (made unique), freeing its old one."""
        self._names.discard(self.tensors[tid].name)
        self.tensors[tid].name = self.unique(name)
        self._names.add(self.tensors[tid].name)

    def new_grad(self, of: int, shape: Sequence[int] | None = None) -> int:
        """The (partial) gradient tensor of `of`: same dtype, its shape unless given."""
        t = self.tensors[of]
        part = "::part" if self.expected.get(of, 1) > 1 else ""
        role = Role.WEIGHT_GRADIENT if t.role == Role.WEIGHT else Role.GRADIENT
        return self.new_tensor(f"grad::{t.name}{part}", t.shape if shape is None else shape,
                               t.dtype, role)

    def emit(self, op_type: str, inputs: Sequence[int], outputs: Sequence[int], name: str,
             /, **attrs: Any) -> None:
        """Append a kernel of ours (domain "autotm")."""
        self.kernels.append(KernelDraft(name, op_type, BACKWARD_DOMAIN, attrs, list(inputs),
                                        list(outputs)))


# backward(tape, forward kernel, output grads (None: zero), needed input slots) -> input grads
BackwardFn = Callable[[Tape, KernelDraft, list[int | None], list[bool]], list[int | None]]
PrepareFn = Callable[[Tape, KernelDraft], None]


@dataclass(frozen=True)
class Rule:
    """How one forward op trains.

    `inputs`/`outputs`: the differentiable slots (gradients flow only through these, and only
    for float tensors); None means all. `prepare` rewrites the forward kernel for training
    (extra saved outputs, training mode). `backward` emits the backward kernels.
    """

    backward: BackwardFn
    inputs: tuple[int, ...] | None = None
    outputs: tuple[int, ...] | None = (0,)
    prepare: PrepareFn | None = None

    def diff_inputs(self, kernel: KernelDraft) -> range | tuple[int, ...]:
        return range(len(kernel.inputs)) if self.inputs is None else self.inputs

    def diff_outputs(self, kernel: KernelDraft) -> range | tuple[int, ...]:
        return range(len(kernel.outputs)) if self.outputs is None else self.outputs


def grad_name(k: KernelDraft, what: str) -> str:
    return f"{k.name}/{what}"
