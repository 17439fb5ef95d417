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
from autotm_py.planning.paths import DROP, F0, READ, START, WRITE, TensorPaths
from autotm_py.planning.schedule import ScheduleBuilder, to_plan

if TYPE_CHECKING:
    from collections.abc import Mapping

    from autotm_py.machine import MachineModel
    from autotm_py.plan import Plan, SolverStats
    from autotm_py.planning.formulation import Formulation


@dataclass
class Walk:
    """One tensor's decoded timeline: start kind and (gadget index, event) in order."""

    start: int
    events: list[tuple[int, str]] = field(default_factory=list)


def walk(p: TensorPaths, values: list[float]) -> Walk:
    """The path's start and its READ/WRITE/DROP events, reads before transitions per layer."""
    chosen = [e for e, v in zip(p.edges, values, strict=True) if v > 0.5]
    start = next((e.dst % 3 for e in chosen if e.kind == START), F0)
    events = [(e.layer, e.kind) for e in chosen if e.kind in (READ, WRITE, DROP)]
    events.sort(key=lambda ev: (ev[0], ev[1] != READ))
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
        if kind == READ:
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
        if kind == READ:
            opened = kernels[layer]
        elif opened is not None:  # WRITE or DROP after this gadget
            out.append((opened, kernels[layer]))
            opened = None
    if opened is not None:
        out.append((opened, last))
    return out


def emit(b: ScheduleBuilder, machine: MachineModel, tid: int, p: TensorPaths, w: Walk) -> None:
    """Add the tensor's initial tier, moves and frees to the schedule."""
    g = p.gadgets
    kernels = g.kernels
    if g.given:
        b.initial[tid] = (FAST,) if w.start == F0 else (SLOW,)
    fast, slow = w.start == F0, w.start != F0
    for layer, kind in w.events:
        k = kernels[layer]
        if kind == READ:
            b.read(tid, k, MODE_NAMES[g.read[layer]])
            fast = True
        elif kind == WRITE:
            b.evict(tid, k, MODE_NAMES[g.write[layer]])
            fast, slow = False, True
        else:
            b.free(tid, FAST, k)
            fast = False
    if not g.survives:
        last = machine.live_ranges[tid][1]
        for tier, present in ((FAST, fast), (SLOW, slow)):
            if present:
                b.free(tid, tier, last)


def decode(f: Formulation, *, config: Mapping[str, Any], solver: SolverStats,
           notes: tuple[str, ...] = ()) -> Plan:
    """The Plan of a solved formulation (variable values read from PuLP)."""
    machine = f.machine
    graph = machine.graph
    b = ScheduleBuilder(len(graph.kernels))
    intervals: dict[int, list[tuple[int, int]]] = {}
    for tid, p in enumerate(f.paths):
        if p is None:  # pinned, or fixed in fast memory for life
            if graph.tensors[tid].producer is None:
                b.initial[tid] = (FAST,)
            if tid in f.fixed and tid not in machine.survivors:
                b.free(tid, FAST, machine.live_ranges[tid][1])
            continue
        values = [v.varValue or 0.0 for v in f.x[tid]]
        w = prune_reads(p, walk(p, values), graph.tensors[tid].users)
        emit(b, machine, tid, p, w)
        birth, last = machine.live_ranges[tid]
        intervals[tid] = fast_intervals(p, w, birth, last)
    for kid, kernel in enumerate(graph.kernels):
        b.compute(kid, tuple(FAST if tid not in intervals or
                             any(a <= kid <= z for a, z in intervals[tid]) else SLOW
                             for tid in kernel.io))
    return to_plan(machine, b, f.strategy, config=config, solver=solver, notes=notes)
