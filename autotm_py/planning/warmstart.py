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

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from autotm_py.memory.tiers import FAST
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
    from autotm_py.planning.gadgets import TensorGadgets
    from autotm_py.planning.paths import TensorPaths

Events = dict[int, tuple[int, list[tuple[int, str]]]]  # tensor -> (start kind, [(kernel, kind)])
END = "end"  # the tensor's range ends after this kernel: it dies there
# reads are carried by mode: a sync read maps onto the sync read edge of the target's gadget
READ_SYNC, READ_ASYNC = "read:sync", "read:async"

log = logging.getLogger(__name__)


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


def overlap_copies(f: Formulation, events: Events) -> Events | None:
    """`events` (a sync plan `f` holds: `apply` ran) with its blocking copies overlapped where
    memory allows: each sync read moved to an async read gadget before its use, each sync
    write to an async write gadget after it, provided no other move of the tensor lies between
    and every kernel on the way has room for it (the capacity rows and the regenerations'
    memory rows, at the start's values). A read goes to the latest gadget whose kernels up to
    the use hide its copy (else the earliest), a write to the first gadget after it: the
    tensor holds fast memory no longer than the overlap needs, which keeps the plan packable
    into an arena. Tensors go largest first. None when nothing moved. The async model's own
    search starts from a sync plan otherwise, and on a large graph (a 3B decoder, 90k
    variables) HiGHS may not improve on it in the time it has."""
    room = _room(f)
    if room is None:
        return None
    machine = f.machine
    used = np.array([u.varValue or 0.0 for u in f.capacity])
    # seconds of kernels before kernel k: ahead[k] - ahead[j] is kernels j .. k-1
    ahead = np.concatenate([[0.0], np.cumsum([machine.fast_time(k) for k in range(len(used))])])
    out, moved = dict(events), 0
    for tid in sorted(events, key=lambda t: -int(machine.sizes[t])):
        p = f.paths[tid] if tid < len(f.paths) else None
        if p is None:
            continue
        start, evs = events[tid]
        copy_s = machine.copy_time(tid, FAST, "async")
        new = _overlapped(p, start, evs, float(machine.sizes[tid]) * MIB, used, room,
                          lambda lo, hi, c=copy_s: ahead[hi] - ahead[lo] >= c)
        if new is not None:
            out[tid] = (start, new)
            moved += 1
    return out if moved else None


def overlap_start(f: Formulation, base: Events) -> None:
    """Start an async model from `base`, which it holds, with its blocking copies overlapped
    where memory allows (`overlap_copies`), when that point holds every row and is faster;
    else keep `base` (`solve._start`, for models of `solve.OVERLAP_START_MIN_VARIABLES`)."""
    before = objective_value(f)
    better = overlap_copies(f, base)
    if better is None or not apply(f, better):
        return
    after = objective_value(f)
    if after < before - 1e-9 and holds(f):
        log.info("%s starts from its copies overlapped: %.3f ms (%.3f ms with them blocking)",
                 f.name, after, before)
        return
    apply(f, base)


def _room(f: Formulation) -> np.ndarray | None:
    """Per kernel, the most U_k may reach: its bound, less where a regeneration's memory row
    (3b) at that kernel has less slack; None without capacity rows."""
    if not f.capacity:
        return None
    room = np.array([u.upBound if u.upBound is not None else np.inf for u in f.capacity])
    used = np.array([u.varValue or 0.0 for u in f.capacity])
    for k, row in f.regen_memory:
        room[k] = min(room[k], used[k] - (row.value() or 0.0))
    return room


def _overlapped(p: TensorPaths, start: int, evs: list[tuple[int, str]], size: float,
                used: np.ndarray, room: np.ndarray, hides: Callable[[int, int], bool]
                ) -> list[tuple[int, str]] | None:
    """The tensor's events with its sync reads moved earlier and sync writes later (`used`
    updated for what moved), or None when none could. `hides(lo, hi)`: kernels lo .. hi-1
    take as long as the tensor's copy."""
    g = p.gadgets
    out, changed = sorted(evs, key=lambda e: e[0]), False
    for i, (k, kind) in enumerate(list(out)):
        # a read moves back only over kernels where the tensor is in the slow tier alone
        before = (out[i - 1][0] if out[i - 1][1] in (WRITE, DROP) else None) if i else \
            (-1 if start == S else None)
        after = out[i + 1][0] if i + 1 < len(out) else max(g.last, g.kernels[-1]) + 1
        if kind == READ_SYNC and before is not None:
            spots = [kk for kk in _spots(g, g.read, ASYNC) if before < kk < k
                     and _fits(used, room, kk, k, size)]
            hidden = [kk for kk in spots if hides(kk, k)]
            moved = hidden[-1] if hidden else (spots[0] if spots else None)
            if moved is not None:
                used[moved:k] += size
                out[i], changed = (moved, READ_ASYNC), True
        elif kind == WRITE and k in g.kernels and g.write[g.kernels.index(k)] == SYNC:
            moved = next((kk for kk in _spots(g, g.write, ASYNC) if k < kk < after
                          and _fits(used, room, k + 1, kk + 1, size)), None)
            if moved is not None:
                used[k + 1:moved + 1] += size
                out[i], changed = (moved, WRITE), True
    return out if changed else None


def _spots(g: TensorGadgets, modes: tuple[int, ...], mode: int) -> list[int]:
    """The kernels of the gadgets whose move (`modes`: read or write) has `mode`."""
    return [k for k, m in zip(g.kernels, modes, strict=True) if m == mode]


def _fits(used: np.ndarray, room: np.ndarray, lo: int, hi: int, size: float) -> bool:
    """Whether `size` more fits on every kernel of [lo, hi)."""
    return hi <= lo or bool(np.all(used[lo:hi] + size <= room[lo:hi] + 1e-9))


def objective_value(f: Formulation) -> float:
    """The objective (ms, its constant part included) at the variables' current values."""
    return float(f.prob.objective.value())


def holds(f: Formulation, eps: float = 1e-6) -> bool:
    """Whether every row of `f` holds at the variables' current values."""
    return all(row.valid(eps) for row in f.prob.constraints.values())
