"""Warm starts: hand a solver a known plan as its first incumbent.

The asynchronous ILP is many times larger than the synchronous one, and every synchronous plan
is a point of it (async gadgets only add choices). So `optimize` solves the synchronous model
first (seconds), maps that solution onto the asynchronous model's variables, and gives it to
CBC or HiGHS as a MIP start: the search then begins from a good plan instead of from nothing,
and a time limit always returns a plan at least as good as the synchronous one.

A solution is carried over as *events*: per tensor, its start tier and its reads, writes,
drops, discards and regenerations keyed by kernel, and where its range ends (a move-only plan
mapped onto a model with recomputation: past that end the tensor is dead, i.e. absent, or
only in the slow tier). `apply` walks the target's location graph along those events, sets the
edge variables, and derives the continuous ones (capacity U_k, epigraph y_k) and the one-hot
IO configurations from them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from autotm_py.planning.decode import effective_users, prune_reads, regenerations, walk
from autotm_py.planning.formulation import MIB, MS, residency_edges, residency_pieces
from autotm_py.planning.gadgets import ASYNC, SYNC
from autotm_py.planning.paths import (
    DISCARD,
    DROP,
    F0,
    F1,
    NK,
    READ,
    REGEN,
    SOURCE,
    START,
    STAY,
    SYNC_READ,
    WRITE,
    S,
    X,
)

if TYPE_CHECKING:
    from autotm_py.planning.formulation import Formulation
    from autotm_py.planning.paths import TensorPaths

Events = dict[int, tuple[int, list[tuple[int, str]]]]  # tensor -> (start kind, [(kernel, kind)])
END = "end"  # the tensor's range ends after this kernel: it dies there
# reads are carried by mode: a sync read maps onto the sync read edge of the target's gadget
READ_SYNC, READ_ASYNC = "read:sync", "read:async"


def events_of(f: Formulation) -> Events:
    """The solved formulation's plan as per-tensor events keyed by kernel."""
    out: Events = {}
    walks = {tid: walk(p, [v.varValue or 0.0 for v in f.x[tid]])
             for tid, p in enumerate(f.paths) if p is not None}
    users = effective_users(f, regenerations(f, walks))
    for tid, w in walks.items():
        p = f.paths[tid]
        assert p is not None
        w = prune_reads(p, w, users[tid])
        events = [(p.gadgets.kernels[layer], _by_mode(p, layer, kind))
                  for layer, kind in w.events]
        if not p.gadgets.survives:
            events.append((p.gadgets.last, END))
        out[tid] = (w.start, events)
    return out


def fix_regenerations(f: Formulation) -> None:
    """Fix every DISCARD and REGEN edge (and regeneration variable) of `f` at its current
    value (a start set by `apply`): the search then only places copies around the start's
    regenerations. The async model is several times the sync one; with its regenerations fixed
    it solves like a move-only model (`solve._chain`)."""
    for tid, p in enumerate(f.paths):
        if p is None:
            continue
        for e, v in zip(p.edges, f.x[tid], strict=True):
            if e.kind in (DISCARD, REGEN):
                v.lowBound = v.upBound = round(v.varValue or 0.0)
    for z, _ in f.regen.values():
        if z is not None:
            z.lowBound = z.upBound = round(z.varValue or 0.0)


def _by_mode(p: TensorPaths, layer: int, kind: str) -> str:
    if kind == SYNC_READ or (kind == READ and p.gadgets.read[layer] == SYNC):
        return READ_SYNC
    return READ_ASYNC if kind == READ else kind


def _read_edge(p: TensorPaths, j: int, kinds: list[str]) -> str | None:
    """The kind of the edge at layer j that does the read among `kinds`, if any."""
    g = p.gadgets
    if READ_SYNC in kinds:
        return READ if g.read[j] == SYNC else SYNC_READ
    if READ_ASYNC in kinds:
        return READ if g.read[j] == ASYNC else "none"
    return None


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
    at: dict[int, list[str]] = {}
    for k, kind in events:
        at.setdefault(k, []).append(kind)
    chosen: list[int | None] = [index.get((SOURCE, start, START))]
    state = start
    last = p.layers if p.gadgets.survives else p.layers - 1
    for j, k in enumerate(p.gadgets.kernels):
        kinds = at.get(k, [])
        read = _read_edge(p, j, kinds)
        if read is not None:
            chosen.append(index.get((j * NK + S, j * NK + F1, read)))
            state = F1
        if REGEN in kinds:
            chosen.append(index.get((j * NK + X, j * NK + F0, REGEN)))
            state = F0
        if j + 1 > last:
            break
        leave = next((kind for kind in (WRITE, DROP, DISCARD) if kind in kinds), None)
        if leave is None and END in kinds:  # dead from here on: absent, or slow only
            leave = {F0: DISCARD, F1: DROP}.get(state)
        if leave is not None:
            dst = X if leave == DISCARD else S
            chosen.append(index.get((j * NK + state, (j + 1) * NK + dst, leave)))
            state = dst
        else:
            chosen.append(index.get((j * NK + state, (j + 1) * NK + state, STAY)))
    return None if None in chosen else set(chosen)  # type: ignore[arg-type]


def _continuous(f: Formulation, values: dict[int, list[float]]) -> None:
    """U_k from the residencies (and the fixed tensors), one-hot configurations, regeneration
    variables, y_k = max of its lower bounds."""
    machine = f.machine
    n = len(machine.graph.kernels)
    if f.capacity:
        delta = np.zeros(n + 1)
        delta[:n] += np.asarray(f.capacity_constant, dtype=float)
        for tid, vals in values.items():
            previous = 0.0
            p = f.paths[tid]
            assert p is not None
            for k, edges in residency_pieces(p, p.gadgets.last):
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
    for z, kept in f.regen.values():
        if z is not None:
            z.varValue = max(v.varValue or 0.0 for v in kept.values())
    for kid, y in f.epigraph.items():
        const, expr = f.kernel_time[kid]
        bounds = [const + _value(expr)] + [_value(t) for t in f.async_terms[kid].values()]
        y.varValue = max(bounds) * MS
    if f.constant_var is not None:
        f.constant_var.varValue = 1.0


def _value(expr: dict) -> float:
    return sum(c * (v.varValue or 0.0) for v, c in expr.items())
