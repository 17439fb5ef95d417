"""Warm starts: hand a solver a known plan as its first incumbent.

The asynchronous ILP is many times larger than the synchronous one, and every synchronous plan
is a point of it (async gadgets only add choices). So `optimize` solves the synchronous model
first (seconds), maps that solution onto the asynchronous model's variables, and gives it to
CBC or HiGHS as a MIP start: the search then begins from a good plan instead of from nothing,
and a time limit always returns a plan at least as good as the synchronous one.

A solution is carried over as *events*: per tensor, its start tier and its reads, writes and
drops keyed by kernel. `apply` walks the target's location graph along those events, sets the
edge variables, and derives the continuous ones (capacity U_k, epigraph y_k) and the one-hot
IO configurations from them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from autotm_py.planning.decode import prune_reads, walk
from autotm_py.planning.formulation import MIB, MS, residency_edges, residency_pieces
from autotm_py.planning.paths import DROP, F1, READ, SOURCE, START, STAY, WRITE, S

if TYPE_CHECKING:
    from autotm_py.planning.formulation import Formulation
    from autotm_py.planning.paths import TensorPaths

Events = dict[int, tuple[int, list[tuple[int, str]]]]  # tensor -> (start kind, [(kernel, kind)])


def events_of(f: Formulation) -> Events:
    """The solved formulation's plan as per-tensor events keyed by kernel."""
    out: Events = {}
    users = {t.id: t.users for t in f.machine.graph.tensors}
    for tid, p in enumerate(f.paths):
        if p is None:
            continue
        w = prune_reads(p, walk(p, [v.varValue or 0.0 for v in f.x[tid]]), users[tid])
        out[tid] = (w.start, [(p.gadgets.kernels[layer], kind) for layer, kind in w.events])
    return out


def apply(f: Formulation, events: Events) -> bool:
    """Set every variable of `f` to the point `events` describe; False if that is not a point
    of `f` (an event at a kernel where `f` has no such edge), and then nothing is set."""
    values: dict[int, list[float]] = {}
    for tid, p in enumerate(f.paths):
        if p is None:
            continue
        start, evs = events.get(tid, (0, []))
        chosen = _path(p, start, evs)
        if chosen is None:
            return False
        values[tid] = [1.0 if i in chosen else 0.0 for i in range(len(p.edges))]
    for tid, vals in values.items():
        for var, v in zip(f.x[tid], vals, strict=True):
            var.varValue = v
    _continuous(f, values)
    return True


def _path(p: TensorPaths, start: int, events: list[tuple[int, str]]) -> set[int] | None:
    """Edge indices of the path that starts in `start` and follows `events`."""
    index = {(e.src, e.dst, e.kind): i for i, e in enumerate(p.edges)}
    at = {k: [kind for kk, kind in events if kk == k] for k, _ in events}
    chosen: list[int | None] = [index.get((SOURCE, start, START))]
    state = start
    last = p.layers if p.gadgets.survives else p.layers - 1
    for j, k in enumerate(p.gadgets.kernels):
        kinds = at.get(k, [])
        if READ in kinds:
            chosen.append(index.get((j * 3 + S, j * 3 + F1, READ)))
            state = F1
        if j + 1 > last:
            break
        if WRITE in kinds or DROP in kinds:
            kind = WRITE if WRITE in kinds else DROP
            chosen.append(index.get((j * 3 + state, (j + 1) * 3 + S, kind)))
            state = S
        else:
            chosen.append(index.get((j * 3 + state, (j + 1) * 3 + state, STAY)))
    return None if None in chosen else set(chosen)  # type: ignore[arg-type]


def _continuous(f: Formulation, values: dict[int, list[float]]) -> None:
    """U_k from the residencies, one-hot configurations, y_k = max of its lower bounds."""
    machine = f.machine
    n = len(machine.graph.kernels)
    if f.capacity:
        delta = np.zeros(n + 1)
        for tid, vals in values.items():
            previous = 0.0
            for k, edges in residency_pieces(f.paths[tid], machine.live_ranges[tid][1]):
                now = sum(vals[i] for i in edges)
                delta[k] += (now - previous) * float(machine.sizes[tid]) * MIB
                previous = now
        for var, u in zip(f.capacity, np.cumsum(delta[:n]), strict=True):
            var.varValue = max(float(u), 0.0)
    for kid, (tensors, configs, cs) in f.configs.items():
        fast = tuple(sum(values[t][i] for i in residency_edges(f.paths[t], kid)) > 0.5
                     for t in tensors)
        for c, conf in zip(cs, configs, strict=True):
            c.varValue = 1.0 if conf == fast else 0.0
    for kid, y in f.epigraph.items():
        const, expr = f.kernel_time[kid]
        bounds = [const + _value(expr)] + [_value(t) for t in f.async_terms[kid].values()]
        y.varValue = max(bounds) * MS
    if f.constant_var is not None:
        f.constant_var.varValue = 1.0


def _value(expr: dict) -> float:
    return sum(c * (v.varValue or 0.0) for v, c in expr.items())
