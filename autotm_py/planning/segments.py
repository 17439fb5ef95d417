"""Checkpoint-style warm starts for the joint model with early regeneration points.

With early points (`recompute_spec(early=W)`) the joint ILP can express what activation
checkpointing does: keep a *boundary* tensor, drop the activations after it, and before the
backward of that stretch re-run its forward kernels one after another, each output kept until
its backward use. HiGHS does not find such plans by itself in the time it has (docs/planning.md,
"Early points"): they differ from the plan without early points in hundreds of tensors at once.
So we hand it one: `segment_start` builds checkpointing's plan as warm-start events from the
solved model without early points, and the search improves on it.

The construction, per `span` (how many backward kernels a stretch of regenerations may reach
back before a tensor's own first backward use, at most W):

1. Walk the candidates from the last produced to the first. A tensor t is regenerated at
   u(t) = the latest of its regeneration points no later than the earliest kernel where a
   regeneration already chosen needs it (or its first backward use, if earlier), when u(t)
   lies at most `span` backward kernels before its first backward use; else t is a boundary
   (not regenerated). A regenerated t is dropped after its last forward use and kept from u(t) to
   its last use, so every regeneration finds its regenerated inputs in place (their u is no
   later, by the walk's order).
2. Boundaries are kept in fast memory; every other tensor follows the plan without early points
   (`base`), held until its last use or need and read back (synchronously) where a regeneration
   needs it while it is in the slow tier.
3. While a kernel's live bytes exceed its room, the largest kept boundaries live across it
   (between their last forward use and their first need) are written to the slow tier after
   their last forward use and read back (synchronously) at their first need; where none is
   left, the regenerated tensor waiting across it with the earliest backward use becomes a
   boundary, which splits its segment in two.
4. Then, where the budget leaves room, tensors are kept in fast memory instead of regenerated
   or written, the most time saved per byte first (a knapsack over the room left at every
   kernel): at a loose budget the start regenerates only what is cheap per byte.

The start is checked against every row of the model (`violations`), so only points of it are
handed to the solver; the search's async stages then place the copies around its
regenerations (`solve._chain`).
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

import numpy as np

from autotm_py.memory.tiers import FAST, SLOW
from autotm_py.planning.formulation import MIB
from autotm_py.planning.paths import DISCARD, DROP, F0, F1, REGEN, WRITE, S, X
from autotm_py.planning.recompute import backward_kernels, backward_users, is_forward
from autotm_py.planning.warmstart import END, READ_ASYNC, READ_SYNC, Events, apply

if TYPE_CHECKING:
    from autotm_py.planning.formulation import Formulation

EPS_MIB = 1e-6
MAX_ROUNDS = 200
READS = (READ_SYNC, READ_ASYNC)
Timeline = list[tuple[int, str]]  # (kernel, event) in kernel order, "before" events first


def segment_start(f: Formulation, base: Events, spans: tuple[int, ...]
                  ) -> tuple[float, int, Events] | None:
    """The best feasible checkpoint-style start over `spans`, as (objective in ms, span,
    events), or None when no span gives a point of `f` (module docstring). The variables of
    `f` are left at whatever was tried last: call `warmstart.apply` with the chosen events."""
    best = None
    for span in spans:
        events = segment_events(f, base, span)
        if events is None or not apply(f, events) or violations(f):
            continue
        objective = float(f.prob.objective.value() or 0.0)
        if best is None or objective < best[0]:
            best = (objective, span, events)
    return best


def segment_events(f: Formulation, base: Events, span: int) -> Events | None:
    """Checkpoint-style events for `f` (module docstring, steps 1-3); None when the capacity
    cannot be met by writing boundaries out."""
    plan = _Segments(f, base, span)
    events = _repaired(f, plan)
    if events is None or not plan.keep_more():
        return events
    filled = plan.events()  # step 4
    return filled if apply(f, filled) and not _overfull(f) else events


def _repaired(f: Formulation, plan: _Segments) -> Events | None:
    """Step 3: the plan's events once no kernel is overfull (None if that cannot be had)."""
    for _ in range(MAX_ROUNDS):  # each round repairs every overfull kernel
        events = plan.events()
        if not apply(f, events):
            return None
        over = _overfull(f)
        if not over:
            return events
        if not plan.write_out(over) and not plan.split(over):
            return None
    return None


class _Segments:
    """Step 1's choice, and the events of every tensor under it."""

    def __init__(self, f: Formulation, base: Events, span: int) -> None:
        self.f, self.base, self.span = f, base, span
        graph = f.machine.graph
        self.pos = {k: i for i, k in enumerate(backward_kernels(graph))}
        assert f.recompute is not None
        self.cands = [t for t in f.recompute.regen if f.paths[t] is not None]
        # first backward use; a tensor read only in the forward pass (a ReLU's input) has none
        # and is regenerated, if at all, where a regeneration of its consumer needs it
        self.first_bw = {t: min(backward_users(graph, t), default=None) for t in self.cands}
        self.forced: set[int] = set()  # boundaries that split a segment too large (step 3)
        self.written: set[int] = set()
        self._choose()

    def _choose(self) -> None:
        """Step 1: the regeneration kernel of each regenerated tensor, the boundaries."""
        graph, spec = self.f.machine.graph, self.f.recompute
        assert spec is not None
        self.at: dict[int, int] = {}  # regenerated tensor -> the kernel it is regenerated at
        self.need: dict[int, set[int]] = defaultdict(set)  # where a regeneration reads it
        for t in sorted(self.cands, key=lambda t: (graph.tensors[t].producer, t), reverse=True):
            first = self.first_bw[t]
            points = [*self.need[t], *([first] if first is not None else [])]
            if not points or t in self.forced:
                continue
            # the latest of its points at which every reader is served: the earliest need,
            # or a grid point before it (a chain's links share the grid, not every kernel)
            u = max((p for p in spec.regen[t] if p <= min(points)), default=None)
            if u is not None and (first is None or self.pos[first] - self.pos[u] <= self.span):
                self.at[t] = u
                producer = graph.tensors[t].producer
                for i in set(self.f.machine.rerun(producer).inputs):  # type: ignore[arg-type]
                    self.need[i].add(u)
        # not regenerated but needed after the forward pass: kept, or written out (step 3)
        self.boundaries = frozenset(t for t in self.cands if t not in self.at
                                    and (self.first_bw[t] is not None or self.need[t]))

    def split(self, over: dict[int, float]) -> bool:
        """At each overfull kernel k, make the regenerated tensor that waits across k with the
        earliest first backward use a boundary: the tensors before it in its segment are then
        regenerated later, from it. False if no tensor waits across any of them."""
        split = False
        for k in over:
            waiting = [t for t, u in self.at.items() if self.first_bw[t] is not None
                       and u <= k < self.first_bw[t]]  # type: ignore[operator]
            if waiting:
                self.forced.add(min(waiting, key=lambda t: (self.first_bw[t], t)))
                split = True
        if split:
            self._choose()
        return split

    def events(self) -> Events:
        out: Events = {}
        for tid, p in enumerate(self.f.paths):
            if p is None:
                continue
            if tid in self.at:
                out[tid] = (F0, self._regenerated(tid))
            elif tid in self.written and tid in self.boundaries:
                out[tid] = (F0, self._written(tid))
            elif tid in self.boundaries or tid in self.first_bw:
                # a boundary is kept; a candidate that nothing needs after the forward pass
                # dies after its last use (the base plan may re-make it for a consumer that
                # this plan does not re-make)
                out[tid] = (F0, self._end(tid, []))
            else:
                out[tid] = self._from_base(tid)
        return out

    def write_out(self, over: dict[int, float]) -> bool:
        """Write out the largest kept boundaries across each overfull kernel until its excess
        (MiB) is covered; False if none was left to write."""
        sizes = self.f.machine.sizes
        wrote = False
        for k, excess in sorted(over.items()):
            across = sorted((t for t in self.boundaries if t not in self.written
                             and self._last_forward(t) < k < self._first_need(t)),
                            key=lambda t: -int(sizes[t]))
            for t in across:
                if excess <= 0:
                    break
                self.written.add(t)
                excess -= float(sizes[t]) * MIB
                wrote = True
        return wrote

    def keep_more(self) -> bool:
        """Step 4, on the values of a feasible start: keep tensors in fast memory instead of
        regenerating or writing them, the most time saved per byte first, wherever their bytes
        fit the room left at every kernel they would add to. False if none fits."""
        f, machine = self.f, self.f.machine
        used = np.array([u.varValue or 0.0 for u in f.capacity])
        room = np.array([u.upBound for u in f.capacity]) - EPS_MIB
        saved: dict[int, tuple[float, int, int]] = {}  # tensor -> (ms saved, first, last)
        for t, u in self.at.items():
            saved[t] = (machine.rerun_time(machine.graph.tensors[t].producer),  # type: ignore
                        self._last_forward(t) + 1, u)
        for t in self.written & self.boundaries:
            saved[t] = (machine.copy_time(t, SLOW, "sync") + machine.copy_time(t, FAST, "sync"),
                        self._last_forward(t) + 1, self._first_need(t))
        kept = False
        for t in sorted(saved, key=lambda t: -saved[t][0] / max(int(machine.sizes[t]), 1)):
            _, a, b = saved[t]
            size = float(machine.sizes[t]) * MIB
            if b > a and bool(np.all(used[a:b] + size <= room[a:b])):
                used[a:b] += size
                self.written.discard(t)
                self.forced.add(t)
                kept = True
        if kept:
            self._choose()
        return kept

    # ---- one tensor's events -----------------------------------------------------------
    def _last_use(self, tid: int) -> int:
        return max([*self.f.machine.graph.tensors[tid].users, *self.need[tid],
                    self.f.machine.live_ranges[tid][0]])

    def _last_forward(self, tid: int) -> int:
        graph = self.f.machine.graph
        forward = [u for u in graph.tensors[tid].users if is_forward(graph.kernels[u])]
        return max([self.f.machine.live_ranges[tid][0], *forward])

    def _first_need(self, tid: int) -> int:
        first = self.first_bw[tid]
        return min([*self.need[tid], *([first] if first is not None else [])])

    def _end(self, tid: int, events: Timeline, after: int = -1) -> Timeline:
        """`events`, then the tensor dies after its last use or need (not before `after`)."""
        p = self.f.paths[tid]
        assert p is not None
        if p.gadgets.survives:
            return events
        return [*events, (max(self._last_use(tid), after), END)]

    def _regenerated(self, tid: int) -> Timeline:
        return self._end(tid, [(self._last_forward(tid), DISCARD), (self.at[tid], REGEN)])

    def _written(self, tid: int) -> Timeline:
        return self._end(tid, [(self._last_forward(tid), WRITE),
                               (self._first_need(tid), READ_SYNC)])

    def _from_base(self, tid: int) -> tuple[int, Timeline]:
        """The base plan's events, held to the last use or need, read back (sync) where a
        regeneration needs the tensor while it is in the slow tier."""
        start, events = self.base.get(tid, (F0, []))
        events = [(k, kind) for k, kind in events if kind != END]
        for v in sorted(self.need[tid]):
            state = _state_at(start, events, v)
            if state == X:  # dropped for good past its last use: keep it instead
                events = [(k, kind) for k, kind in events if not (kind == DISCARD and k < v)]
            elif state == S:
                events = _read_at(events, v)
        return start, self._end(tid, sorted(events, key=_order),
                                after=max((k for k, _ in events), default=-1))


def _order(event: tuple[int, str]) -> tuple[int, bool]:
    k, kind = event
    return k, kind not in (*READS, REGEN)


def _state_at(start: int, events: Timeline, v: int) -> int:
    """The tensor's tier while kernel v runs (its events before v's kernel applied)."""
    state = start
    for k, kind in sorted(events, key=_order):
        if k > v or (k == v and kind not in (*READS, REGEN)):
            break
        state = {READ_SYNC: F1, READ_ASYNC: F1, REGEN: F0, WRITE: S, DROP: S,
                 DISCARD: X}.get(kind, state)
    return state


def _read_at(events: Timeline, v: int) -> Timeline:
    """A sync read before kernel v in place of the next read after it."""
    later = [i for i, (k, kind) in enumerate(events) if kind in READS and k > v]
    out = [e for i, e in enumerate(events) if not later or i != later[0]]
    return [*out, (v, READ_SYNC)]


def _overfull(f: Formulation) -> dict[int, float]:
    """Kernel -> MiB over its room: the capacity bound U_k <= budget - workspace_k, and the
    memory of each re-run (family 8's row 3b) at its kernel."""
    over: dict[int, float] = {}
    for k, u in enumerate(f.capacity):
        excess = (u.varValue or 0.0) - u.upBound
        if excess > EPS_MIB:
            over[k] = excess
    for u, row in f.regen_memory:  # value: left side less right side (<= 0 when met)
        excess = float(row.value() or 0.0)
        if excess > EPS_MIB:
            over[u] = max(over.get(u, 0.0), excess)
    return over


def violations(f: Formulation, eps: float = 1e-6) -> list[Any]:
    """The rows and variable bounds of `f` that its current values violate."""
    bad: list[Any] = [c for c in f.prob._constraints.values()
                      if c.value() is None or not c.valid(eps)]
    for v in f.prob.variables():
        value = v.varValue
        if value is None or (v.lowBound is not None and value < v.lowBound - eps) or \
                (v.upBound is not None and value > v.upBound + eps):
            bad.append(v)
    return bad
