"""`Timeline`: kernels and copies on a time axis, plus bytes per tier over time.

Every plot and the trace read one `Timeline`, whichever source it comes from:

- ``plan-order``: the plan alone. Each kernel and each synchronous move takes one step; an
  asynchronous move spans the kernel it overlaps (several in one direction share it). The unit
  is ``step``: this shows the order of events, not their duration.
- ``simulated``: the simulator's prediction (`SimulationResult.to_dict()`, from
  `autotm simulate -o timeline.json` or recomputed from the model). Unit: seconds.
- ``measured``: an executor run (`RunResult.to_dict()`, `autotm run -o run.json`). Kernels are
  laid end to end with their measured durations (the executor times kernels, not their start
  times, and does not time copies); tier bytes are the plan's, re-timed to those kernels; the
  measured peak of the fast tier is kept beside them. Unit: seconds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from autotm_py.errors import PlanError
from autotm_py.plan import Compute, Move, Plan
from autotm_py.report.residency import Residency


@dataclass(frozen=True)
class KernelSpan:
    kernel: int
    start: float
    end: float


@dataclass(frozen=True)
class MoveSpan:
    record: int
    tensor: int
    to: str  # destination tier: "fast" (slow->fast, a prefetch) or "slow" (an eviction)
    mode: str
    start: float
    end: float
    nbytes: int
    consumer: int | None  # kernel that first reads a prefetched tensor


@dataclass(frozen=True)
class Timeline:
    source: str  # plan-order | simulated | measured
    unit: str  # step | s
    kernels: tuple[KernelSpan, ...]
    moves: tuple[MoveSpan, ...]
    memory_t: np.ndarray  # times at which tier bytes change (non-decreasing)
    memory_fast: np.ndarray  # bytes in the fast tier from memory_t[i] on
    memory_slow: np.ndarray
    budget_bytes: int | None
    total: float  # length of the iteration in `unit`
    measured_peak_fast_bytes: int | None = None
    iteration_times_s: tuple[float, ...] = ()
    notes: tuple[str, ...] = ()
    modelled_peak_bytes: int | None = None  # exact peak (a curve may merge same-instant points)
    # out of budget_bytes, besides the plan's tensors: the runtime's own memory (cuBLAS
    # workspaces on a GPU) and the share left free for fragmentation (--headroom)
    reserve_bytes: int = 0
    headroom_bytes: int = 0

    @property
    def peak_fast_bytes(self) -> int:
        if self.modelled_peak_bytes is not None:
            return self.modelled_peak_bytes
        return int(self.memory_fast.max()) if len(self.memory_fast) else 0


def _record_curve(record_time: Sequence[float], res: Residency
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Tier bytes after each record on a time axis; records at one instant (the frees after a
    kernel, the copies and outputs of the next) collapse into the last value at that time."""
    return last_per_instant(np.asarray(record_time, dtype=float), res.fast_bytes,
                            res.slow_bytes)


def last_per_instant(t: np.ndarray, fast: np.ndarray, slow: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Make times non-decreasing and keep the last point of each instant."""
    if not len(t):
        return t, fast[:0], slow[:0]
    t = np.maximum.accumulate(t)
    last = np.append(t[1:] != t[:-1], True)
    return t[last], fast[last], slow[last]


def plan_order_timeline(plan: Plan, res: Residency) -> Timeline:
    """Steps: one per kernel and per sync move; async moves span the kernel they overlap."""
    t, kernel_start, record_time = 0.0, {}, []
    sync_spans: dict[int, tuple[float, float]] = {}
    for i, rec in enumerate(plan.records):
        record_time.append(t)
        if isinstance(rec, Compute):
            kernel_start[rec.kernel] = t
            t += 1.0
        elif isinstance(rec, Move) and rec.mode == "sync":
            sync_spans[i] = (t, t + 1.0)
            t += 1.0
    kernels = tuple(KernelSpan(k, kernel_start[k], kernel_start[k] + 1.0) for k in res.order)
    moves = []
    shares: dict[tuple[int, str], list[int]] = {}
    for m in res.moves:
        if m.mode != "sync":
            shares.setdefault((m.overlaps if m.overlaps is not None else -1, m.to), []).append(
                m.record)
    for m in res.moves:
        if m.record in sync_spans:
            start, end = sync_spans[m.record]
        else:
            group = shares[(m.overlaps if m.overlaps is not None else -1, m.to)]
            base = kernel_start.get(m.overlaps, record_time[m.record])  # type: ignore[arg-type]
            width = 1.0 / len(group)
            start = base + width * group.index(m.record)
            end = start + width
        moves.append(MoveSpan(m.record, m.tensor, m.to, m.mode, start, end, m.nbytes, m.consumer))
    return Timeline("plan-order", "step", kernels, tuple(moves),
                    *_record_curve(record_time, res), plan.header.budget_bytes, t,
                    modelled_peak_bytes=res.peak_fast_bytes, **_outside_plan(plan))


def _outside_plan(plan: Plan) -> dict[str, int]:
    return {"reserve_bytes": plan.header.reserve_bytes,
            "headroom_bytes": plan.header.headroom_bytes}


def measured_timeline(run: Mapping[str, Any], plan: Plan, res: Residency,
                      *, origin: str = "run") -> Timeline:
    """Kernels end to end with their measured times; the plan's tier bytes on that time axis."""
    times = run.get("kernel_times_s")
    iterations = tuple(float(x) for x in run.get("iteration_times_s") or ())
    notes = ["kernel start times are cumulative measured kernel durations; copies are not timed",
             "tier bytes are the plan's, placed on the measured kernel times"]
    if times is None:
        notes = ["the run measured no per-kernel times: only iteration times and the peak"]
        kernels: tuple[KernelSpan, ...] = ()
        record_time = [0.0] * len(plan.records)
        total = float(run.get("median_s") or (iterations[0] if iterations else 0.0))
    else:
        if len(times) < len(res.order) or any(times[k] is None for k in res.order):
            raise PlanError(f"{origin}: kernel_times_s has {len(times)} entries or gaps, the plan "
                            f"computes {len(res.order)} kernels; was the run made with this plan?")
        kernels, record_time = _end_to_end(plan, res, [float(x) for x in times])
        total = kernels[-1].end if kernels else 0.0
    curve = run.get("memory_curve")  # optional [[t, fast, slow], ...] if an executor records one
    if curve:
        arr = np.asarray(curve, dtype=float)
        mem_t, fast, slow = arr[:, 0], arr[:, 1].astype(np.int64), arr[:, 2].astype(np.int64)
        notes[-1] = "tier bytes are the run's recorded memory curve"
    else:
        mem_t, fast, slow = _record_curve(record_time, res)
    peak = run.get("peak_fast_bytes")
    return Timeline("measured", "s", kernels, (), mem_t, fast, slow,
                    run.get("budget_bytes", plan.header.budget_bytes), total,
                    None if peak is None else int(peak), iterations, tuple(notes),
                    modelled_peak_bytes=res.peak_fast_bytes, **_outside_plan(plan))


def _end_to_end(plan: Plan, res: Residency,
                times: list[float]) -> tuple[tuple[KernelSpan, ...], list[float]]:
    t, spans, record_time = 0.0, [], []
    for rec in plan.records:
        record_time.append(t)
        if isinstance(rec, Compute):
            spans.append(KernelSpan(rec.kernel, t, t + times[rec.kernel]))
            t += times[rec.kernel]
    return tuple(spans), record_time


def load_measured(data: Any, *, origin: str) -> Mapping[str, Any]:
    """Check that `data` looks like a `RunResult.to_dict()`; return it."""
    if not isinstance(data, Mapping) or "iteration_times_s" not in data:
        raise PlanError(f"{origin}: not a measured run (no iteration_times_s); write one with "
                        "`autotm run MODEL --plan plan.json -o run.json`")
    return data


def _first(data: Mapping[str, Any], *keys: str, default: Any = None) -> Any:
    for key in keys:
        if key in data and data[key] is not None:
            return data[key]
    return default


def simulated_timeline(sim: Mapping[str, Any], plan: Plan, res: Residency,
                       *, origin: str = "timeline") -> Timeline:
    """The simulator's per-kernel and per-move times and its memory curve, as a Timeline."""
    if not isinstance(sim, Mapping) or not isinstance(sim.get("kernels"), list | tuple) or \
            sim.get("format", "autotm-simulation") != "autotm-simulation":
        raise PlanError(f"{origin}: not a simulation result (no \"kernels\" list); write one "
                        "with `autotm simulate MODEL --plan plan.json -o timeline.json`")
    if len(sim["kernels"]) != len(res.order) or \
            sim.get("model_name", plan.header.model_name) != plan.header.model_name:
        raise PlanError(f"{origin}: a simulation of {sim.get('model_name')!r} with "
                        f"{len(sim['kernels'])} kernels, but the plan computes {len(res.order)} "
                        f"kernels of {plan.header.model_name!r}; simulate this plan")
    try:
        return _simulated(sim, plan, res)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise PlanError(f"{origin}: not a simulation result ({type(exc).__name__}: {exc}); "
                        "write one with `autotm simulate MODEL --plan plan.json -o "
                        "timeline.json`") from None


def _simulated(sim: Mapping[str, Any], plan: Plan, res: Residency) -> Timeline:
    kernels = tuple(KernelSpan(int(_first(k, "kernel", "id")), float(_first(k, "start_s",
                    "start")), float(_first(k, "end_s", "end"))) for k in sim.get("kernels", ()))
    by_record = {m.record: m for m in res.moves}
    moves = []
    for raw in sim.get("moves", ()):
        info = by_record.get(int(_first(raw, "record", default=-1)))
        tensor = int(_first(raw, "tensor", default=info.tensor if info else -1))
        moves.append(MoveSpan(
            int(_first(raw, "record", default=-1)), tensor, str(_first(raw, "to")),
            str(_first(raw, "mode", default="sync")), float(_first(raw, "start_s", "start")),
            float(_first(raw, "end_s", "end")), int(_first(raw, "bytes", "nbytes", default=0)),
            info.consumer if info else None))
    mem_t, fast, slow = _memory_curve(sim.get("memory"))
    total = float(_first(sim, "total_s", "time_s", "predicted_time_s",
                         default=max([k.end for k in kernels] + [0.0])))
    peak = _first(sim, "fast_peak_bytes", default=int(fast.max()) if len(fast) else 0)
    return Timeline("simulated", "s", kernels, tuple(moves), mem_t, fast, slow,
                    _first(sim, "budget_bytes", default=plan.header.budget_bytes), total,
                    notes=_sim_notes(sim), modelled_peak_bytes=int(peak), **_outside_plan(plan))


def _sim_notes(sim: Mapping[str, Any]) -> tuple[str, ...]:
    """The simulation's notes, and its rule violations (a non-strict run keeps going)."""
    notes = [str(n) for n in sim.get("notes", ())]
    violations = list(sim.get("violations", ()))
    if violations:
        notes.append(f"the simulator found {len(violations)} rule violation(s); the first: "
                     f"{violations[0]}")
    return tuple(notes)


def _memory_curve(memory: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Columns of {"time_s": [...], "fast_bytes": [...], "slow_bytes": [...]} or rows of them."""
    if not memory:
        return np.zeros(0), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    if isinstance(memory, Mapping):
        cols = memory
    else:
        cols = {key: [row[key] for row in memory] for key in ("time_s", "fast_bytes",
                                                              "slow_bytes")}
    return last_per_instant(np.asarray(cols["time_s"], dtype=float),
                            np.asarray(cols["fast_bytes"], dtype=np.int64),
                            np.asarray(cols["slow_bytes"], dtype=np.int64))
