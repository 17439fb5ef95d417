"""Chrome / Perfetto trace (Trace Event Format, JSON object form) of a plan's schedule.

One process per timeline: ``predicted`` (pid 1) and, when given, ``measured`` (pid 2). Each has
a compute track, one track per copy direction (slices on one track must nest, so concurrent
streams need their own tracks), flow arrows from each prefetch to the kernel that first reads
the tensor, and one counter track of bytes per tier. Re-runs of a plan that recomputes are
slices of the compute track (they run on the compute stream) in their own colour: all named
``recompute`` (Perfetto colours a slice by its name; chrome://tracing reads `cname`), category
``recompute``, the kernel re-run and the tensors regenerated in their args, with a flow arrow
``regenerate`` to the kernel that reads them. Timestamps and durations are microseconds
(the format's unit). A plan-order timeline has no durations: one step is drawn as 1 ms, and
``otherData`` says so. Open the file in https://ui.perfetto.dev or chrome://tracing.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from autotm_py.report.residency import PlanView
from autotm_py.report.timeline import MoveSpan, RecomputeSpan, Timeline

US_PER_STEP = 1000.0  # a plan-order step drawn as 1 ms
COMPUTE_TID, ITERATION_TID = 1, 2
# copies of one direction overlapping in time (a model that lets them share a link) go to extra
# lanes: the direction's tid + lane number
COPY_TIDS = {"fast": 10, "slow": 20}
COPY_NAMES = {"fast": "copy slow→fast (prefetch)", "slow": "copy fast→slow (evict)"}
RECOMPUTE_NAME = "recompute"  # one name: one colour in Perfetto
RECOMPUTE_CNAME = "yellow"  # chrome://tracing's reserved colour names (Perfetto ignores cname)


def chrome_trace(view: PlanView, predicted: Timeline, measured: Timeline | None = None,
                 *, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """The trace document: ``{"traceEvents": [...], "displayTimeUnit": "ms", ...}``."""
    events: list[dict[str, Any]] = []
    flow_ids = iter(range(1, 1 << 62))
    events += _process(view, predicted, 1, "predicted", flow_ids)
    if measured is not None:
        events += _process(view, measured, 2, "measured", flow_ids)
    other = {"model": view.model_name, "predicted_source": predicted.source,
             "units": "microseconds" if predicted.unit == "s"
             else f"plan steps drawn as {US_PER_STEP / 1000:g} ms each"}
    other.update(meta or {})
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}


def _scale(tl: Timeline) -> float:
    return US_PER_STEP if tl.unit == "step" else 1e6


def _metadata(pid: int, label: str, tl: Timeline,
              lanes: list[tuple[MoveSpan, int]]) -> list[dict[str, Any]]:
    out = [{"ph": "M", "pid": pid, "tid": 0, "name": "process_name",
            "args": {"name": f"{label} ({tl.source})"}},
           {"ph": "M", "pid": pid, "tid": 0, "name": "process_sort_index",
            "args": {"sort_index": pid}}]
    tracks = {COMPUTE_TID: "compute (kernels and re-runs)" if tl.recomputes else "compute"}
    if tl.iteration_times_s or tl.measured_peak_fast_bytes is not None:
        tracks[ITERATION_TID] = "iterations (measured)"
    for to, base in COPY_TIDS.items():
        for lane in sorted({lane for m, lane in lanes if m.to == to}):
            tracks[base + lane] = COPY_NAMES[to] + (f" #{lane + 1}" if lane else "")
    for tid, name in sorted(tracks.items()):
        out.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name",
                    "args": {"name": name}})
        out.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index",
                    "args": {"sort_index": tid}})
    return out


def copy_lanes(moves: Sequence[MoveSpan]) -> list[tuple[MoveSpan, int]]:
    """Each move with the first lane of its direction that is free when it starts."""
    ends: dict[str, list[float]] = {"fast": [], "slow": []}
    out = []
    for m in sorted(moves, key=lambda m: (m.start, m.record)):
        lane_ends = ends[m.to]
        lane = next((i for i, end in enumerate(lane_ends) if end <= m.start + 1e-12),
                    len(lane_ends))
        if lane == len(lane_ends):
            lane_ends.append(m.end)
        lane_ends[lane] = m.end
        out.append((m, lane))
    return out


def _process(view: PlanView, tl: Timeline, pid: int, label: str,
             flow_ids: Iterator[int]) -> list[dict[str, Any]]:
    us = _scale(tl)
    lanes = copy_lanes(tl.moves)
    events = _metadata(pid, label, tl, lanes)
    starts: dict[int, float] = {}
    for span in tl.kernels:
        starts[span.kernel] = span.start * us
        events.append({
            "ph": "X", "pid": pid, "tid": COMPUTE_TID, "cat": "kernel",
            "name": view.kernel_names[span.kernel], "ts": span.start * us,
            "dur": max(span.end - span.start, 0.0) * us,
            "args": {"kernel": span.kernel, "op": view.kernel_ops[span.kernel]},
        })
    for r in tl.recomputes:
        events += _recompute_events(view, r, pid, us, starts, flow_ids)
    for m, lane in lanes:
        events += _move_events(view, m, COPY_TIDS[m.to] + lane, pid, us, starts, flow_ids)
    events += _counters(tl, pid, us)
    events += _iterations(tl, pid)
    return events


def _move_events(view: PlanView, m: MoveSpan, tid: int, pid: int, us: float,
                 starts: dict[int, float], flow_ids: Iterator[int]) -> list[dict[str, Any]]:
    ts, dur = m.start * us, max(m.end - m.start, 0.0) * us
    name = view.tensor_names[m.tensor]
    out = [{"ph": "X", "pid": pid, "tid": tid, "cat": "copy", "name": f"{name} → {m.to}",
            "ts": ts, "dur": dur,
            "args": {"tensor": m.tensor, "bytes": m.nbytes, "mode": m.mode,
                     "record": m.record, "consumer": m.consumer}}]
    if m.to == "fast" and m.consumer is not None and m.consumer in starts:
        fid = next(flow_ids)
        common = {"pid": pid, "cat": "prefetch", "name": "prefetch", "id": fid}
        # the start binds to the copy slice, the end ("bp": "e") to the consumer's slice
        out.append({"ph": "s", "tid": tid, "ts": ts, **common})
        out.append({"ph": "f", "bp": "e", "tid": COMPUTE_TID,
                    "ts": max(starts[m.consumer], ts), **common})
    return out


def _recompute_events(view: PlanView, r: RecomputeSpan, pid: int, us: float,
                      starts: dict[int, float], flow_ids: Iterator[int]) -> list[dict[str, Any]]:
    ts, dur = r.start * us, max(r.end - r.start, 0.0) * us
    out = [{"ph": "X", "pid": pid, "tid": COMPUTE_TID, "cat": "recompute",
            "name": RECOMPUTE_NAME, "cname": RECOMPUTE_CNAME, "ts": ts, "dur": dur,
            "args": {"kernel": r.kernel, "kernel_name": view.kernel_names[r.kernel],
                     "op": view.kernel_ops[r.kernel], "before": r.before,
                     "regenerates": [view.tensor_names[t] for t in r.outputs],
                     "bytes": r.nbytes, "record": r.record}}]
    if r.before in starts:
        fid = next(flow_ids)
        common = {"pid": pid, "cat": "recompute", "name": "regenerate", "id": fid}
        out.append({"ph": "s", "tid": COMPUTE_TID, "ts": ts, **common})
        out.append({"ph": "f", "bp": "e", "tid": COMPUTE_TID,
                    "ts": max(starts[r.before], ts), **common})
    return out


def _counters(tl: Timeline, pid: int, us: float) -> list[dict[str, Any]]:
    out = []
    for t, fast, slow in zip(tl.memory_t, tl.memory_fast, tl.memory_slow, strict=True):
        out.append({"ph": "C", "pid": pid, "tid": 0, "name": "fast tier bytes",
                    "ts": float(t) * us, "args": {"fast": int(fast)}})
        out.append({"ph": "C", "pid": pid, "tid": 0, "name": "slow tier bytes",
                    "ts": float(t) * us, "args": {"slow": int(slow)}})
    if tl.budget_bytes:
        for t in (0.0, tl.total):
            out.append({"ph": "C", "pid": pid, "tid": 0, "name": "fast tier budget",
                        "ts": t * us, "args": {"budget": int(tl.budget_bytes)}})
    return out


def _iterations(tl: Timeline, pid: int) -> list[dict[str, Any]]:
    """Measured iterations end to end on their own track (their count and spread show)."""
    out, t = [], 0.0
    for i, seconds in enumerate(tl.iteration_times_s):
        out.append({"ph": "X", "pid": pid, "tid": ITERATION_TID, "cat": "iteration",
                    "name": f"iteration {i}", "ts": t * 1e6, "dur": seconds * 1e6,
                    "args": {"seconds": seconds}})
        t += seconds
    if tl.measured_peak_fast_bytes is not None:
        out.append({"ph": "i", "s": "p", "pid": pid, "tid": ITERATION_TID, "ts": 0.0,
                    "name": "measured fast-tier peak",
                    "args": {"bytes": tl.measured_peak_fast_bytes}})
    return out
