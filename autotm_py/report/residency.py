"""Where every tensor of a plan is, kernel by kernel, rebuilt from the plan's records alone.

A plan carries a names table (`plan.names`: tensor names, bytes and roles, kernel names and op
types, and each kernel's input/output tensor ids), so reports need no graph: `PlanView` reads
those tables (or a `TensorGraph` when one is at hand), and `walk` replays the records with the
plan interpreter (`autotm_py.interpreter.PlanInterpreter`):

- a tensor without a producer starts in the tiers of `plan.initial`;
- ``Compute(k, placement)`` creates each output of k in its slot's tier;
- ``Move(t, to)`` adds a copy in `to`; ``Free(t, tier)`` drops that copy.

Tier bytes are counted as budgets are (`memory.accounting`): each tensor occupies its size
rounded up to the allocator's granularity, and with ``--pin-weights`` the pinned roles (inputs,
labels, weights, optimizer state, constants) sit outside the budget and are not counted. This
is bookkeeping, not verification (the simulator's strict mode checks the rules). Kernel
workspace is not counted: the plan does not carry it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from autotm_py.errors import PlanError
from autotm_py.interpreter import PlanInterpreter
from autotm_py.memory.accounting import PINNED_ROLES, aligned
from autotm_py.plan import Compute, Free, Move, Plan

if TYPE_CHECKING:
    from autotm_py.ir.graph import TensorGraph

FAST_BIT, SLOW_BIT = 1, 2  # residency mask: 0 absent, 1 fast, 2 slow, 3 both
_BITS = {"fast": FAST_BIT, "slow": SLOW_BIT}


@dataclass(frozen=True)
class PlanView:
    """The names and sizes a report needs, indexed by tensor id and kernel id."""

    model_name: str
    tensor_names: tuple[str, ...]
    tensor_bytes: tuple[int, ...]
    tensor_roles: tuple[str, ...]
    kernel_names: tuple[str, ...]
    kernel_ops: tuple[str, ...]
    kernel_io: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]

    @classmethod
    def from_graph(cls, graph: TensorGraph) -> PlanView:
        return cls(
            graph.name,
            tuple(t.name for t in graph.tensors),
            tuple(t.nbytes for t in graph.tensors),
            tuple(t.role.value for t in graph.tensors),
            tuple(k.name for k in graph.kernels),
            tuple(k.op_type for k in graph.kernels),
            tuple((k.inputs, k.outputs) for k in graph.kernels),
        )

    @classmethod
    def from_plan(cls, plan: Plan, graph: TensorGraph | None = None) -> PlanView:
        """The graph's tables when given, else the plan's own `names` tables."""
        if graph is not None:
            return cls.from_graph(graph)
        names = plan.names
        if not names.get("tensors") or "kernel_io" not in names:
            raise PlanError(f"plan of {plan.header.model_name!r} carries no names/kernel_io "
                            "table (written by an older autotm); give the model too "
                            "(`autotm report plan.json --model MODEL`)")
        tensors = sorted(names["tensors"], key=lambda row: int(row[0]))
        kernels = sorted(names["kernels"], key=lambda row: int(row[0]))
        io = tuple((tuple(int(t) for t in ins), tuple(int(t) for t in outs))
                   for ins, outs in names["kernel_io"])
        return cls(
            plan.header.model_name,
            tuple(str(row[1]) for row in tensors),
            tuple(int(row[2]) for row in tensors),
            tuple(str(row[3]) for row in tensors),
            tuple(str(row[1]) for row in kernels),
            tuple(str(row[2]) for row in kernels),
            io,
        )

    @property
    def n_tensors(self) -> int:
        return len(self.tensor_names)


@dataclass(frozen=True)
class MoveInfo:
    """One Move record with what a report shows about it."""

    record: int  # index in plan.records
    tensor: int
    to: str
    mode: str
    overlaps: int | None
    nbytes: int
    position: int  # index (in plan order) of the first compute after the move
    consumer: int | None  # first kernel after the move that reads the tensor


@dataclass(frozen=True)
class Residency:
    """The result of `walk`: per-record tier bytes, per-kernel residency, the moves."""

    order: tuple[int, ...]  # kernel ids in plan order
    compute_records: tuple[int, ...]  # record index of each compute, in plan order
    fast_bytes: np.ndarray  # int64, counted bytes in the fast tier after each record
    slow_bytes: np.ndarray
    moves: tuple[MoveInfo, ...]
    # per tensor: (plan-order position, mask) from which the mask holds while kernels run
    changes: tuple[tuple[tuple[int, int], ...], ...]

    @property
    def peak_fast_bytes(self) -> int:
        return int(self.fast_bytes.max()) if len(self.fast_bytes) else 0

    def state_matrix(self, rows: Sequence[int]) -> np.ndarray:
        """uint8 [len(rows), kernels]: the mask of each tensor in `rows` while each kernel runs."""
        out = np.zeros((len(rows), len(self.order)), dtype=np.uint8)
        for r, tid in enumerate(rows):
            for pos, mask in self.changes[tid]:
                out[r, pos:] = mask
        return out

    def moved_tensors(self) -> set[int]:
        return {m.tensor for m in self.moves}


class _Walker(PlanInterpreter):
    """Replays records, keeping each tensor's mask and the running bytes per tier."""

    def __init__(self, view: PlanView, plan: Plan) -> None:
        super().__init__(None, plan)
        self.view = view
        pinned = {r.value for r in PINNED_ROLES} if plan.header.pin_weights \
            else set()
        self.counted = [0 if role in pinned else aligned(n)
                        for n, role in zip(view.tensor_bytes, view.tensor_roles, strict=True)]
        self.mask = np.zeros(view.n_tensors, dtype=np.uint8)
        self.fast = self.slow = 0
        self.position = 0
        self.changes: list[list[tuple[int, int]]] = [[] for _ in range(view.n_tensors)]
        self.fast_after: list[int] = []  # counted bytes per tier after each record
        self.slow_after: list[int] = []
        self.order: list[int] = []  # kernel ids in plan order
        self.compute_records: list[int] = []

    def set_mask(self, tid: int, mask: int) -> None:
        old = int(self.mask[tid])
        nbytes = self.counted[tid]
        self.fast += nbytes * (((mask & FAST_BIT) > 0) - ((old & FAST_BIT) > 0))
        self.slow += nbytes * (((mask & SLOW_BIT) > 0) - ((old & SLOW_BIT) > 0))
        self.mask[tid] = mask
        self.changes[tid].append((self.position, mask))

    def start(self) -> None:
        for tid, tiers in self.plan.initial.items():
            self._check(tid)
            self.set_mask(tid, sum(_BITS[t] for t in set(tiers)))

    def move(self, record: Move) -> None:
        self._check(record.tensor)
        self.set_mask(record.tensor, int(self.mask[record.tensor]) | _BITS[record.to])

    def free(self, record: Free) -> None:
        self._check(record.tensor)
        self.set_mask(record.tensor, int(self.mask[record.tensor]) & ~_BITS[record.tier])

    def compute(self, record: Compute) -> None:
        if not 0 <= record.kernel < len(self.view.kernel_io):
            raise PlanError(f"compute of kernel #{record.kernel}: no such kernel in the plan's "
                            "names table; is the plan complete?")
        self.order.append(record.kernel)
        self.compute_records.append(self.index)
        ins, outs = self.view.kernel_io[record.kernel]
        for slot, tid in enumerate(outs, start=len(ins)):
            tier = record.placement[slot] if slot < len(record.placement) else "fast"
            self.set_mask(tid, int(self.mask[tid]) | _BITS[tier])
        # changes made before this increment (moves before k, k's outputs) show during k
        self.position += 1

    def after(self, record: Compute | Move | Free) -> None:
        self.fast_after.append(self.fast)
        self.slow_after.append(self.slow)

    def _check(self, tid: int) -> None:
        if not 0 <= tid < self.view.n_tensors:
            raise PlanError(f"tensor #{tid} is not in the plan's names table")


def walk(plan: Plan, view: PlanView) -> Residency:
    """Replay `plan` and return its residency (see the module docstring)."""
    w = _Walker(view, plan)
    w.run()
    return Residency(
        order=tuple(w.order),
        compute_records=tuple(w.compute_records),
        fast_bytes=np.asarray(w.fast_after, dtype=np.int64),
        slow_bytes=np.asarray(w.slow_after, dtype=np.int64),
        moves=_moves(plan, view),
        changes=tuple(tuple(c) for c in w.changes),
    )


def _moves(plan: Plan, view: PlanView) -> tuple[MoveInfo, ...]:
    """Every Move with its plan-order position and its consumer (found walking backwards)."""
    n_computes = sum(1 for r in plan.records if isinstance(r, Compute))
    next_reader: dict[int, int] = {}
    position = n_computes
    out: list[MoveInfo] = []
    for i in range(len(plan.records) - 1, -1, -1):
        rec = plan.records[i]
        if isinstance(rec, Compute):
            position -= 1
            for tid in view.kernel_io[rec.kernel][0]:
                next_reader[tid] = rec.kernel
        elif isinstance(rec, Move):
            consumer = next_reader.get(rec.tensor) if rec.to == "fast" else None
            out.append(MoveInfo(i, rec.tensor, rec.to, rec.mode, rec.overlaps,
                                view.tensor_bytes[rec.tensor], position, consumer))
    return tuple(reversed(out))
