"""Decode a solved ILP into a Plan (AutoTM section 1.8, without rewriting a framework graph).

Each tensor's chosen path (edges with flow > 0.5) gives its start tier and an ordered list of
reads, write-evictions and drops at its gadgets. A read whose copy no kernel uses before it is
dropped (or before the tensor dies) is removed with its drop: the solver may pick such moves
when an overlapped copy hides them for free, and they would only waste bandwidth. Writes are
never useless: a written tensor is either read back, read from the slow tier, or needed at the
end of the iteration.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from autotm_py.memory.tiers import FAST, SLOW
from autotm_py.planning.gadgets import MODE_NAMES
from autotm_py.planning.paths import (
    DISCARD,
    DROP,
    F0,
    NK,
    READ,
    REGEN,
    START,
    SYNC_READ,
    WRITE,
    TensorPaths,
)
from autotm_py.planning.schedule import ScheduleBuilder, to_plan

if TYPE_CHECKING:
    from collections.abc import Mapping

    from autotm_py.plan import Plan, SolverStats
    from autotm_py.planning.formulation import Formulation


@dataclass
class Walk:
    """One tensor's decoded timeline: start kind and (gadget index, event) in order."""

    start: int
    events: list[tuple[int, str]] = field(default_factory=list)


EVENTS = (READ, SYNC_READ, REGEN, WRITE, DROP, DISCARD)
BEFORE = (READ, SYNC_READ, REGEN)  # events before the gadget's kernel; the others after it
READS = (READ, SYNC_READ)


def walk(p: TensorPaths, values: list[float]) -> Walk:
    """The path's start and its events, those before each gadget's kernel first."""
    chosen = [e for e, v in zip(p.edges, values, strict=True) if v > 0.5]
    start = next((e.dst % NK for e in chosen if e.kind == START), F0)
    events = [(e.layer, e.kind) for e in chosen if e.kind in EVENTS]
    events.sort(key=lambda ev: (ev[0], ev[1] not in BEFORE))
    return Walk(start, events)


def prune_reads(p: TensorPaths, w: Walk, users: tuple[int, ...]) -> Walk:
    """Remove reads with no user kernel before the copy is dropped or the tensor dies."""
    kernels = p.gadgets.kernels
    kept: list[tuple[int, str]] = []
    skip_drop = False
    for i, (layer, kind) in enumerate(w.events):
        if kind == DROP and skip_drop:
            skip_drop = False
            continue
        if kind in READS:
            until = next((kernels[j] for j, k in w.events[i + 1:] if k == DROP), None)
            hi = until if until is not None else float("inf")
            if not any(kernels[layer] <= u <= hi for u in users):
                skip_drop = until is not None
                continue
        kept.append((layer, kind))
    return Walk(w.start, kept)


def fast_intervals(p: TensorPaths, w: Walk, birth: int, last: int) -> list[tuple[int, int]]:
    """Kernel intervals (inclusive) during which the tensor is in fast memory."""
    kernels = p.gadgets.kernels
    out = []
    opened = birth if w.start == F0 else None
    for layer, kind in w.events:
        if kind in BEFORE:
            opened = kernels[layer]
        elif opened is not None:  # WRITE, DROP or DISCARD after this gadget
            out.append((opened, kernels[layer]))
            opened = None
    if opened is not None:
        out.append((opened, last))
    return out


def emit(b: ScheduleBuilder, tid: int, p: TensorPaths, w: Walk,
         fill: float | None = None,
         write_spans: Mapping[tuple[int, int], tuple[tuple[int, float], ...]] | None = None
         ) -> None:
    """Add the tensor's initial tier, moves and frees to the schedule (its regenerations are
    added per producer by `decode`). `fill`: the tensor's known value; its reads are fills and
    its writes drops (no copy: it needs no slow copy)."""
    g = p.gadgets
    kernels = g.kernels
    if g.given:
        b.initial[tid] = (FAST,) if w.start == F0 else (SLOW,)
    fast, slow = w.start == F0, w.start != F0
    for layer, kind in w.events:
        k = kernels[layer]
        if kind in READS and fill is not None:
            b.fill(tid, k, fill)
            fast = True
        elif kind in READS:
            b.read(tid, k, "sync" if kind == SYNC_READ else MODE_NAMES[g.read[layer]])
            fast = True
        elif kind == REGEN:
            fast = True
        elif kind == WRITE and fill is not None:
            b.free(tid, FAST, k)
            fast = False
        elif kind == WRITE:
            span = (write_spans or {}).get((tid, layer))
            b.evict(tid, k, MODE_NAMES[g.write[layer]], span[-1][0] if span else None)
            fast, slow = False, True
        else:  # DROP or DISCARD
            b.free(tid, FAST, k)
            fast = False
    if not g.survives:
        for tier, present in ((FAST, fast), (SLOW, slow)):
            if present:
                b.free(tid, tier, g.last)


def regenerations(f: Formulation, walks: Mapping[int, Walk]) -> dict[tuple[int, int], list[int]]:
    """(producer, kernel) -> the outputs regenerated before that kernel, from the walks."""
    graph = f.machine.graph
    out: dict[tuple[int, int], list[int]] = {}
    for tid, w in walks.items():
        p = f.paths[tid]
        assert p is not None
        for layer, kind in w.events:
            if kind == REGEN:
                key = (graph.tensors[tid].producer, p.gadgets.kernels[layer])
                out.setdefault(key, []).append(tid)  # type: ignore[arg-type]
    return out


def effective_users(f: Formulation, regens: Mapping[tuple[int, int], list[int]]
                    ) -> dict[int, tuple[int, ...]]:
    """Per tensor, the kernels that read it, and those before which a regeneration reads it."""
    graph = f.machine.graph
    extra: dict[int, set[int]] = {}
    for pid, u in regens:
        for i in f.machine.rerun(pid).inputs:
            extra.setdefault(i, set()).add(u)
    return {t.id: tuple(sorted(set(t.users) | extra.get(t.id, set()))) for t in graph.tensors}


def decode(f: Formulation, *, config: Mapping[str, Any], solver: SolverStats,
           notes: tuple[str, ...] = ()) -> Plan:
    """The Plan of a solved formulation (variable values read from PuLP)."""
    machine = f.machine
    graph = machine.graph
    b = ScheduleBuilder(len(graph.kernels))
    intervals: dict[int, list[tuple[int, int]]] = {}
    walks = {tid: walk(p, [v.varValue or 0.0 for v in f.x[tid]])
             for tid, p in enumerate(f.paths) if p is not None}
    regens = regenerations(f, walks)
    users = effective_users(f, regens)
    for (pid, u), outputs in sorted(regens.items()):
        b.recompute(pid, tuple(sorted(outputs)), u)
    for tid, p in enumerate(f.paths):
        if p is None:  # pinned, or fixed in fast memory for life
            if graph.tensors[tid].producer is None:
                b.initial[tid] = (FAST,)
            if tid in f.fixed and tid not in machine.survivors:
                b.free(tid, FAST, max([machine.live_ranges[tid][1], *users[tid]]))
            continue
        w = prune_reads(p, walks[tid], users[tid])
        emit(b, tid, p, w, f.fills.get(tid), f.write_spans)
        intervals[tid] = fast_intervals(p, w, machine.live_ranges[tid][0], p.gadgets.last)
    for kid, kernel in enumerate(graph.kernels):
        b.compute(kid, tuple(FAST if tid not in intervals or
                             any(a <= kid <= z for a, z in intervals[tid]) else SLOW
                             for tid in kernel.io))
    return to_plan(machine, b, f.name, config=config, solver=solver, notes=notes)
