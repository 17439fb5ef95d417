"""The tensor-graph IR: frozen `Tensor`, `Kernel` and `TensorGraph` with dense integer ids.

Kernels are numbered 0..N-1 in execution order (a fixed topological order); tensors 0..M-1.
Nothing mutates a graph after it is built (use `GraphBuilder`), so every derived fact (liveness,
live bytes, working sets) is computed once and cached.

Liveness (used by the footprint, the planner and the simulator):
- a tensor is born at its producer kernel, or at kernel 0 when it has no producer (graph inputs,
  weights, optimizer state, constants);
- it dies after its last user; a tensor with no users dies at its producer;
- tensors that must survive the iteration live until the last kernel: graph outputs, and
  *persistent* tensors (weights, optimizer state, constants) that are not replaced by a newer
  version through `TensorGraph.carried` (training updates a weight W into W'; W dies at its last
  use and W' lives to the end).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from typing import Any

import numpy as np

from autotm_py.errors import GraphError
from autotm_py.ir.dtypes import DTYPE_SIZES
from autotm_py.ir.validate import validate_graph


class Role(StrEnum):
    """What a tensor is for. Persistent roles survive from one iteration to the next."""

    INPUT = "input"
    LABEL = "label"
    WEIGHT = "weight"
    ACTIVATION = "activation"
    GRADIENT = "gradient"
    WEIGHT_GRADIENT = "weight_gradient"
    OPTIMIZER_STATE = "optimizer_state"
    CONSTANT = "constant"
    OUTPUT = "output"

    @property
    def persistent(self) -> bool:
        return self in (Role.WEIGHT, Role.OPTIMIZER_STATE, Role.CONSTANT)


AttrValue = int | float | str | tuple[Any, ...] | None


def freeze_attrs(attrs: Mapping[str, Any]) -> tuple[tuple[str, AttrValue], ...]:
    """Sorted (name, value) pairs with lists turned into tuples, so attributes are immutable."""

    def freeze(value: Any) -> AttrValue:
        if isinstance(value, list | tuple):
            return tuple(freeze(v) for v in value)
        if isinstance(value, np.ndarray):
            return tuple(freeze(v) for v in value.tolist())
        if isinstance(value, np.generic):
            return value.item()  # type: ignore[no-any-return]
        if isinstance(value, bytes):
            return value.decode()
        return value  # type: ignore[no-any-return]

    return tuple(sorted((str(k), freeze(v)) for k, v in attrs.items()))


@dataclass(frozen=True, slots=True)
class Tensor:
    """One SSA value: produced once (or given), read by `users` in execution order."""

    id: int
    name: str
    shape: tuple[int, ...]
    dtype: str
    role: Role
    producer: int | None
    users: tuple[int, ...]
    # stored N, H, W, C (torch's channels_last) rather than row-major: `ir.layout`
    channels_last: bool = False

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_SIZES[self.dtype]


@dataclass(frozen=True, slots=True)
class Kernel:
    """One operator invocation. `inputs`/`outputs` are tensor ids in the op's slot order.

    `domain` is "" for ONNX ops and "autotm" for the backward, loss and optimizer ops of ours.
    Constant operands that parametrize an op (shapes, axes, pads, scales...) are folded into
    `attrs` by the importer, so `inputs` holds only real tensors. `signature` keys the profile
    cache: identical kernels (repeated blocks) share it.
    """

    id: int
    name: str
    op_type: str
    domain: str
    attrs: tuple[tuple[str, AttrValue], ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    signature: str
    workspace_bytes: int = 0
    # positions in `outputs` of the tensors stored channels-last (`ir.layout`)
    channels_last: tuple[int, ...] = ()

    def attr(self, name: str, default: Any = None) -> Any:
        for key, value in self.attrs:
            if key == name:
                return value
        return default

    @property
    def attrs_dict(self) -> dict[str, AttrValue]:
        return dict(self.attrs)

    @property
    def io(self) -> tuple[int, ...]:
        """Inputs then outputs: the slot order of an IO placement."""
        return self.inputs + self.outputs


def kernel_signature(
    op_type: str,
    domain: str,
    attrs: tuple[tuple[str, AttrValue], ...],
    inputs: Sequence[tuple[tuple[int, ...], str]],
    outputs: Sequence[tuple[tuple[int, ...], str]],
) -> str:
    """A stable text key: op, attributes, input and output shapes and dtypes."""
    body = json.dumps(
        {
            "op": f"{domain}::{op_type}" if domain else op_type,
            "attrs": [[k, v] for k, v in attrs],
            "in": [[list(s), d] for s, d in inputs],
            "out": [[list(s), d] for s, d in outputs],
        },
        separators=(",", ":"),
        sort_keys=True,
        default=str,
    )
    return body


@dataclass(frozen=True)
class TensorGraph:
    """Kernels in execution order and the tensors they read and write.

    `constants` holds the values of small constant tensors that execution needs (folded masks,
    scalars); weights are never stored here. `carried` pairs (tensor read at the start of an
    iteration, tensor holding its value at the end), e.g. (W, W') for an SGD update. `meta`
    records provenance: source file, model hash, opset, batch, training settings.
    """

    name: str
    kernels: tuple[Kernel, ...]
    tensors: tuple[Tensor, ...]
    inputs: tuple[int, ...] = ()
    outputs: tuple[int, ...] = ()
    carried: tuple[tuple[int, int], ...] = ()
    constants: Mapping[int, np.ndarray] = field(default_factory=dict)
    meta: Mapping[str, Any] = field(default_factory=dict)

    # ---- lookups -------------------------------------------------------------------------
    def tensor(self, tid: int) -> Tensor:
        return self.tensors[tid]

    def kernel(self, kid: int) -> Kernel:
        return self.kernels[kid]

    def name_of(self, tid: int) -> str:
        return self.tensors[tid].name

    @cached_property
    def tensor_ids_by_name(self) -> dict[str, int]:
        return {t.name: t.id for t in self.tensors}

    def by_name(self, name: str) -> Tensor:
        try:
            return self.tensors[self.tensor_ids_by_name[name]]
        except KeyError:
            raise GraphError(f"no tensor named {name!r} in graph {self.name!r}") from None

    def tensors_with_role(self, *roles: Role) -> Iterator[Tensor]:
        return (t for t in self.tensors if t.role in roles)

    # ---- liveness ------------------------------------------------------------------------
    @cached_property
    def _replaced(self) -> frozenset[int]:
        return frozenset(first for first, last in self.carried if first != last)

    def survives_iteration(self, tid: int) -> bool:
        """True when the tensor must still exist after the last kernel."""
        t = self.tensors[tid]
        if tid in self._output_set:
            return True
        return t.role.persistent and tid not in self._replaced

    @cached_property
    def _output_set(self) -> frozenset[int]:
        return frozenset(self.outputs)

    @cached_property
    def live_ranges(self) -> tuple[tuple[int, int], ...]:
        """(first, last) kernel index, both inclusive, for every tensor."""
        last_kernel = max(len(self.kernels) - 1, 0)
        ranges = []
        for t in self.tensors:
            start = t.producer if t.producer is not None else 0
            end = max([start, *t.users])
            if self.survives_iteration(t.id):
                end = last_kernel
            ranges.append((start, end))
        return tuple(ranges)

    @cached_property
    def kernel_workspace_bytes(self) -> np.ndarray:
        """Each kernel's workspace in the IR (int64 array of length N): bytes it allocates
        beyond its slots while it runs."""
        return np.fromiter((k.workspace_bytes for k in self.kernels), dtype=np.int64,
                           count=len(self.kernels))

    @cached_property
    def live_bytes(self) -> np.ndarray:
        """Bytes live while each kernel runs (int64 array of length N): every live tensor plus
        the kernel's own workspace, so never below its working set (`working_set_bytes`)."""
        delta = np.zeros(len(self.kernels) + 1, dtype=np.int64)
        for t, (start, end) in zip(self.tensors, self.live_ranges, strict=True):
            delta[start] += t.nbytes
            delta[end + 1] -= t.nbytes
        return np.cumsum(delta[:-1]) + self.kernel_workspace_bytes

    @cached_property
    def peak_live_bytes(self) -> int:
        """The unconstrained footprint: the largest live total over the iteration (tensors and
        the running kernel's workspace), at least the largest working set."""
        return int(self.live_bytes.max()) if len(self.kernels) else 0

    @cached_property
    def peak_kernel(self) -> int:
        return int(self.live_bytes.argmax()) if len(self.kernels) else 0

    @cached_property
    def tensor_bytes(self) -> np.ndarray:
        """Bytes of every tensor, indexed by tensor id (int64 array)."""
        return np.fromiter((t.nbytes for t in self.tensors), dtype=np.int64,
                           count=len(self.tensors))

    @cached_property
    def working_set_bytes(self) -> np.ndarray:
        """Each kernel's distinct inputs + outputs + workspace: what must fit for it to run."""
        sizes = self.tensor_bytes
        return np.array([int(sizes[list(set(k.io))].sum()) for k in self.kernels],
                        dtype=np.int64) + self.kernel_workspace_bytes

    @cached_property
    def max_working_set(self) -> tuple[int, int]:
        """(bytes, kernel id) of the largest working set: the smallest budget of the GPU rule."""
        if not self.kernels:
            return (0, -1)
        kid = int(self.working_set_bytes.argmax())
        return int(self.working_set_bytes[kid]), kid

    def live_at(self, kid: int) -> list[int]:
        """Tensor ids live at kernel `kid` (computed on demand; use `live_bytes` for totals)."""
        return [t for t, (s, e) in enumerate(self.live_ranges) if s <= kid <= e]

    # ---- summaries -----------------------------------------------------------------------
    @cached_property
    def model_hash(self) -> str:
        """A hash of the graph's structure (kernels, signatures, tensors): plans carry it."""
        h = hashlib.sha256()
        for k in self.kernels:
            h.update(f"{k.op_type}|{k.inputs}|{k.outputs}|{k.signature}\n".encode())
        for t in self.tensors:
            layout = "|nhwc" if t.channels_last else ""
            h.update(f"{t.name}|{t.shape}|{t.dtype}|{t.role.value}{layout}\n".encode())
        return h.hexdigest()[:16]

    @cached_property
    def unique_signatures(self) -> int:
        return len({k.signature for k in self.kernels})

    def bytes_by_role(self) -> dict[Role, int]:
        out: dict[Role, int] = {}
        for t in self.tensors:
            out[t.role] = out.get(t.role, 0) + t.nbytes
        return out

    def bytes_by_dtype(self) -> dict[str, tuple[int, int]]:
        """dtype -> (tensors, bytes): what a mixed-precision graph holds in each type."""
        out: dict[str, tuple[int, int]] = {}
        for t in self.tensors:
            count, nbytes = out.get(t.dtype, (0, 0))
            out[t.dtype] = (count + 1, nbytes + t.nbytes)
        return out

    def summary(self) -> dict[str, Any]:
        ws, ws_kernel = self.max_working_set
        return {
            "name": self.name,
            "kernels": len(self.kernels),
            "unique_kernels": self.unique_signatures,
            "tensors": len(self.tensors),
            "peak_live_bytes": self.peak_live_bytes,
            "peak_kernel": self.peak_kernel,
            "max_working_set_bytes": ws,
            "max_working_set_kernel": ws_kernel,
            "model_hash": self.model_hash,
        }

    # ---- checks --------------------------------------------------------------------------
    def validate(self) -> TensorGraph:
        """Raise `GraphError` naming the first broken invariant; return self when all hold."""
        validate_graph(self)
        return self
