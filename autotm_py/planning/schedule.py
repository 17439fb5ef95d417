"""`ScheduleBuilder`: collects moves and frees per kernel and emits plan records in the
canonical order that the ILP's memory accounting assumes.

For each kernel k, in this order:

1. blocking reads into fast memory that k needs (``Move(t, fast, sync)``), and the fills of
   known-value tensors (``Fill(t, value)``) in their place;
1b. regenerations before k (``Recompute(p, outputs, before=k)``), in producer order, so that a
   regenerated input is there before the re-run that reads it;
2. overlapped copies of step k (``Move(t, to, async, overlaps=k)``), reads first;
3. ``Compute(k, placement)``;
4. frees after k: dead tensors, dropped fast copies, fast copies written by step k's async
   writes (released when the copy is done: the ILP counts them to the end of the step), or,
   priced over a span (`--write-pricing spread`), by an earlier step's write whose span ends
   at k (the ILP counts them to its end);
5. blocking write-evictions after k (``Move(t, slow, sync)`` then ``Free(t, fast)``).

Between two kernels memory first shrinks (4, 5) then grows (1, 2 of the next kernel), so the
fast bytes in use never exceed the larger of the two kernels' rows, which the ILP bounds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from autotm_py.memory.tiers import FAST, SLOW
from autotm_py.options import SOURCE_META_KEY, ModelOptions
from autotm_py.plan import (
    Compute,
    CostsIdentity,
    Fill,
    Free,
    Move,
    Plan,
    PlanHeader,
    Recompute,
    Record,
    SolverStats,
    names_table,
)

if TYPE_CHECKING:
    from autotm_py.ir.graph import TensorGraph
    from autotm_py.machine import MachineModel


@dataclass
class ScheduleBuilder:
    """Per-kernel buckets of records; `records()` flattens them in the canonical order."""

    n_kernels: int
    initial: dict[int, tuple[str, ...]] = field(default_factory=dict)
    placements: dict[int, tuple[str, ...]] = field(default_factory=dict)
    _reads: dict[int, list[Record]] = field(default_factory=dict)
    _recomputes: dict[int, list[Recompute]] = field(default_factory=dict)
    _overlapped_reads: dict[int, list[Record]] = field(default_factory=dict)
    _overlapped_writes: dict[int, list[Record]] = field(default_factory=dict)
    _frees: dict[int, list[Record]] = field(default_factory=dict)
    _writes: dict[int, list[Record]] = field(default_factory=dict)
    tail: list[Record] = field(default_factory=list)  # after the last kernel

    def read(self, tid: int, kid: int, mode: str = "sync") -> None:
        """Copy `tid` into fast memory before kernel `kid` (sync) or beside it (async)."""
        if mode == "async":
            self._overlapped_reads.setdefault(kid, []).append(Move(tid, FAST, "async", kid))
        else:
            self._reads.setdefault(kid, []).append(Move(tid, FAST, "sync"))

    def fill(self, tid: int, kid: int, value: float) -> None:
        """Make `tid`'s fast copy with a fill kernel before kernel `kid` (where a read would)."""
        self._reads.setdefault(kid, []).append(Fill(tid, value))

    def evict(self, tid: int, kid: int, mode: str = "sync", free_after: int | None = None
              ) -> None:
        """Write `tid` to the slow tier after kernel `kid` (sync) or beside it (async), then
        drop its fast copy: after `kid`, or for an async write priced over later kernels too
        (`formulation.write_span`) after `free_after`, the last of them."""
        if mode == "async":
            self._overlapped_writes.setdefault(kid, []).append(Move(tid, SLOW, "async", kid))
            self._frees.setdefault(kid if free_after is None else free_after, []).append(
                Free(tid, FAST))
        else:
            self._writes.setdefault(kid, []).extend((Move(tid, SLOW, "sync"), Free(tid, FAST)))

    def recompute(self, pid: int, outputs: tuple[int, ...], kid: int) -> None:
        """Re-run kernel `pid` before kernel `kid` to regenerate `outputs` in fast memory."""
        self._recomputes.setdefault(kid, []).append(Recompute(pid, outputs, kid))

    def free(self, tid: int, tier: str, kid: int) -> None:
        """Drop the copy of `tid` in `tier` after kernel `kid`."""
        self._frees.setdefault(kid, []).append(Free(tid, tier))

    def compute(self, kid: int, placement: tuple[str, ...]) -> None:
        self.placements[kid] = placement

    def records(self) -> tuple[Record, ...]:
        out: list[Record] = []
        for k in range(self.n_kernels):
            out.extend(self._reads.get(k, ()))
            out.extend(sorted(self._recomputes.get(k, ()), key=lambda r: r.kernel))
            out.extend(self._overlapped_reads.get(k, ()))
            out.extend(self._overlapped_writes.get(k, ()))
            out.append(Compute(k, self.placements[k]))
            out.extend(self._frees.get(k, ()))
            out.extend(self._writes.get(k, ()))
        out.extend(self.tail)
        return tuple(out)


def move_counts(records: tuple[Record, ...], graph: TensorGraph) -> dict[str, int]:
    """Number and bytes of moves per direction and mode, e.g. ``bytes_to_slow_async``, and of
    recomputations (``recomputes``, ``recomputed_bytes``: the outputs they keep)."""
    counts: dict[str, int] = {}
    for rec in records:
        if isinstance(rec, Fill):
            counts["fills"] = counts.get("fills", 0) + 1
            counts["filled_bytes"] = counts.get("filled_bytes", 0) + int(
                graph.tensor_bytes[rec.tensor])
        elif isinstance(rec, Recompute):
            counts["recomputes"] = counts.get("recomputes", 0) + 1
            counts["recomputed_bytes"] = counts.get("recomputed_bytes", 0) + sum(
                int(graph.tensor_bytes[t]) for t in rec.outputs)
        elif isinstance(rec, Move):
            key = f"to_{rec.to}_{rec.mode}"
            counts[f"moves_{key}"] = counts.get(f"moves_{key}", 0) + 1
            nbytes = int(graph.tensor_bytes[rec.tensor])
            counts[f"bytes_{key}"] = counts.get(f"bytes_{key}", 0) + nbytes
    return counts


def _priced_gpu(machine: MachineModel, device: str) -> str | None:
    """The GPU whose profiles priced a GPU-mode plan (None in host mode or for costs given
    without profiles)."""
    return (machine.profile_costs.target or None) if device == "cuda" else None


def to_plan(machine: MachineModel, builder: ScheduleBuilder, strategy: str, *,
            config: Mapping[str, Any], solver: SolverStats | None = None,
            notes: tuple[str, ...] = ()) -> Plan:
    """A Plan of `model.graph` from the builder's records (predicted time set by the caller)."""
    graph = machine.graph
    records = builder.records()
    counts: dict[str, Any] = {"kernels": len(graph.kernels), "records": len(records),
                              **move_counts(records, graph)}
    if counts.get("recomputes"):
        # the GPU time the re-runs hold the compute stream, as the simulator counts it
        # (`simulate`'s and `report`'s recomputed time; on a GPU the host's share of a kernel's
        # profiled time overlaps the device's work)
        counts["recompute_s"] = sum(machine.rerun_device_time(r.kernel) for r in records
                                    if isinstance(r, Recompute))
    device = str(config.get("device") or machine.costs.device)
    header = PlanHeader(
        model_hash=graph.model_hash,
        model_name=graph.name,
        strategy=strategy,
        budget_bytes=machine.user_budget,
        memory_system=machine.memory.to_dict(),
        solver=solver or SolverStats(),
        graph_summary=graph.summary(),
        counts=counts,
        config={**config, "pin_weights": machine.pin_weights},
        notes=notes,
        device=device,
        pin_weights=machine.pin_weights,
        headroom=machine.headroom,
        model=ModelOptions.of_graph(graph),
        run=machine.run.resolved(),
        costs=CostsIdentity.of(machine.profile_costs),
        gpu=_priced_gpu(machine, device),
        source=graph.meta.get(SOURCE_META_KEY),
    )
    return Plan(header, dict(builder.initial), records, names_table(graph))
