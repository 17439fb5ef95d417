"""An exhaustive optimizer of the planning model, independent of the ILP, for tiny graphs.

It searches every assignment of a tier state (F0: fast only, F1: fast with a valid slow copy,
S: slow only) to every tensor at every kernel of its life, with every move that connects them:
a dynamic program over kernels whose state is the tuple of states of the live tensors (plus the
overlapped reads of the current step and the start tiers of carried tensors), so it is exact.
It shares only the model's *definition* with the planner: the decision points
(`tensor_gadgets`) and the prices (`MachineModel`), never its formulation or decoding.

Transitions of a tensor between kernels k and k+1: stay; write-evict F0 -> S after gadget k
(write mode of k); drop F1 -> S after gadget k; read S -> F1 at gadget k+1 (read mode of
k+1); and both, F0 -> F1 (write then read, with no kernel between them).

With recomputation (a `RecomputeSpec`, the shared definition of where tensors may be
regenerated): a fourth state X (absent); discard F0 -> X after a gadget from `discard_from`
on; regenerate X -> F0 before a regeneration gadget k+1, which re-runs the producer p before
kernel k+1 for its time (once per producer and kernel), needs every input of p in fast memory
and not still arriving by an overlapped read at k+1, and needs room for the fast tensors at
k+1, p's workspace and p's outputs that are not kept. X is never allowed at a kernel that reads
or writes the tensor.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from autotm_py.machine import MachineModel
from autotm_py.memory.tiers import FAST, SLOW
from autotm_py.plan import Plan
from autotm_py.planning.gadgets import ASYNC, MODE_NAMES, NONE, SYNC, TensorGadgets, tensor_gadgets
from autotm_py.planning.recompute import RecomputeSpec
from autotm_py.planning.schedule import ScheduleBuilder, to_plan

F0, F1, S, X = "F0", "F1", "S", "X"
FASTISH = (F0, F1)


@dataclass(frozen=True)
class Option:
    state: str
    events: tuple[tuple[str, int, str], ...]  # (kind, kernel, mode): read at / evict-drop after


def _modes(gadgets: dict[int, object], tid: int) -> tuple[dict[int, int], dict[int, int]]:
    g = gadgets[tid]
    reads = dict(zip(g.kernels, g.read, strict=True))
    writes = dict(zip(g.kernels, g.write, strict=True))
    return reads, writes


def _transitions(state: str, k: int, reads: dict[int, int], writes: dict[int, int],
                 to_end: bool, g: TensorGadgets) -> list[Option]:
    """Options of a tensor from state `state` during k to its state at k+1 (or the end)."""
    gadget = k in reads
    out = _moves(state, k, reads, writes, to_end, gadget)
    if not to_end and k + 1 in reads and g.sync_reads(g.kernels.index(k + 1)):
        out += [o for o in _moves(state, k, {**reads, k + 1: SYNC}, writes, to_end, gadget)
                if any(e[0] == "read" for e in o.events)]  # the extra sync read there
    if state == F0 and gadget and 0 <= g.discard_from <= g.kernels.index(k):
        out.append(Option(X, (("discard", k, ""),)))
    if state == X and not to_end and k + 1 in reads and g.regenerates(g.kernels.index(k + 1)):
        out.append(Option(F0, (("regen", k + 1, ""),)))
    return out


def _moves(state: str, k: int, reads: dict[int, int], writes: dict[int, int], to_end: bool,
           gadget: bool) -> list[Option]:
    w, r = writes.get(k, NONE), (NONE if to_end else reads.get(k + 1, NONE))
    out = [Option(state, ())]
    if state == F0 and w != NONE:
        out.append(Option(S, (("evict", k, MODE_NAMES[w]),)))
        if r != NONE:
            out.append(Option(F1, (("evict", k, MODE_NAMES[w]), ("read", k + 1, MODE_NAMES[r]))))
    if state == F1 and gadget:
        out.append(Option(S, (("drop", k, ""),)))
    if state == S and r != NONE:
        out.append(Option(F1, (("read", k + 1, MODE_NAMES[r]),)))
    return out


class BruteForce:
    """Exhaustive search; `solve()` returns (best time in seconds, Plan) or (None, None)."""

    def __init__(self, machine: MachineModel, strategy: str, window: int = 15,
                 fixed: frozenset[int] = frozenset(), recompute: RecomputeSpec | None = None,
                 moves: bool = True) -> None:
        self.machine = machine
        self.strategy = strategy
        gl = tensor_gadgets(machine, strategy, window, fixed=fixed, recompute=recompute,
                            moves=moves)
        self.gadgets = {g.tensor: g for g in gl if g is not None}
        self.modes = {t: _modes(self.gadgets, t) for t in self.gadgets}
        self.n = len(machine.graph.kernels)
        self.ranges = recompute.ranges(machine) if recompute is not None else \
            machine.live_ranges
        self.carried_first = tuple(a for a, _ in machine.steady_pairs)

    def live(self, k: int) -> list[int]:
        return [t for t in self.gadgets if self.ranges[t][0] <= k <= self.ranges[t][1]]

    def births(self, k: int) -> list[int]:
        return [t for t in self.gadgets if self.ranges[t][0] == k]

    # ---- the per-step checks and prices ----------------------------------------------------
    def fits(self, k: int, states: dict[int, str]) -> bool:
        used = sum(int(self.machine.sizes[t]) for t, s in states.items() if s in FASTISH)
        budget = self.machine.tensor_budget
        return budget is None or used + int(self.machine.workspace[k]) <= budget

    def gpu_ok(self, k: int, states: dict[int, str]) -> bool:
        """GPU: every IO tensor of kernel k is in fast memory; both modes: none is absent."""
        io = set(self.machine.graph.kernels[k].io)
        ok = FASTISH if self.machine.gpu else (F0, F1, S)
        return all(s in ok for t, s in states.items() if t in io)

    def regenerations(self, k: int, states: dict[int, str], events: tuple) -> float | None:
        """Seconds of the regenerations before kernel k (events of the transition into k), or
        None when one is not possible (an input absent or still arriving, or no room)."""
        graph, machine = self.machine.graph, self.machine
        groups: dict[int, set[int]] = {}
        for t, e in events:
            if e[0] == "regen":
                groups.setdefault(graph.tensors[t].producer, set()).add(t)
        arriving = {t for t, e in events if e[0] == "read" and e[2] == "async"}
        used = sum(int(machine.sizes[t]) for t, s in states.items() if s in FASTISH)
        seconds = 0.0
        for pid, kept in groups.items():
            kernel = graph.kernels[pid]
            for i in set(kernel.inputs):
                if i not in machine.pinned and (states.get(i) not in FASTISH or i in arriving):
                    return None
            scratch = sum(int(machine.sizes[o]) for o in kernel.outputs if o not in kept)
            if machine.tensor_budget is not None and \
                    used + int(machine.workspace[pid]) + scratch > machine.tensor_budget:
                return None
            seconds += machine.fast_time(pid)
        return seconds

    def placement(self, k: int, states: dict[int, str]) -> tuple[str, ...]:
        return tuple(SLOW if states.get(t) == S else FAST for t in self.machine.graph.kernels[k].io)

    def start_options(self, t: int) -> list[Option]:
        g = self.gadgets[t]
        out = [Option(F0, ())]
        if g.may_start_slow:
            out.append(Option(S, ()))
            r = self.modes[t][0].get(self.ranges[t][0], NONE)
            if g.given and r != NONE:
                out.append(Option(F1, (("read", self.ranges[t][0], MODE_NAMES[r]),)))
        return out

    # ---- the dynamic program ---------------------------------------------------------------
    def solve(self) -> tuple[float | None, Plan | None]:
        layer = self._initial_layer()
        history = []
        for k in range(self.n):
            layer, back = self._advance(k, layer)
            history.append(back)
            if not layer:
                return None, None
        best = min(layer.items(), key=lambda kv: kv[1][0], default=None)
        if best is None:
            return None, None
        return best[1][0], self._plan(history, best[0])

    def _initial_layer(self) -> dict:
        live0 = self.live(0)
        layer = {}
        for combo in itertools.product(*(self.start_options(t) for t in live0)):
            states = {t: o.state for t, o in zip(live0, combo, strict=True)}
            if not (self.fits(0, states) and self.gpu_ok(0, states)):
                continue
            events = tuple((t, e) for t, o in zip(live0, combo, strict=True) for e in o.events)
            starts = tuple((t, F0 if states[t] == F0 else S) for t in self.carried_first
                           if t in states)
            reads = frozenset(t for t, e in events if e[2] == "async")
            cost = sum(self.machine.copy_time(t, FAST, "sync") for t, e in events
                       if e[2] == "sync")
            key = (tuple(sorted(states.items())), reads, starts)
            if key not in layer or cost < layer[key][0]:
                layer[key] = (cost, None, events)
        return layer

    def _advance(self, k: int, layer: dict) -> tuple[dict, dict]:
        nxt: dict = {}
        last = k == self.n - 1
        for key, (cost, _, _) in layer.items():
            states = dict(key[0])
            for combo in self._combos(k, states, last):
                new_states, events = combo
                total = cost + self._step_cost(k, states, key[1], events)
                if last:
                    if not self._steady(key[2], new_states):
                        continue
                    new_key = ("end", tuple(sorted(new_states.items())))
                elif not (self.fits(k + 1, new_states) and self.gpu_ok(k + 1, new_states)):
                    continue
                else:
                    regen = self.regenerations(k + 1, new_states, events)
                    if regen is None:
                        continue
                    total += regen
                    areads = frozenset(t for t, e in events if e[0] == "read" and e[2] == "async")
                    new_key = (tuple(sorted(new_states.items())), areads, key[2])
                total += sum(self.machine.copy_time(t, FAST, "sync") for t, e in events
                             if e[0] == "read" and e[2] == "sync")
                if new_key not in nxt or total < nxt[new_key][0]:
                    nxt[new_key] = (total, key, events)
        return nxt, nxt

    def _combos(self, k: int, states: dict[int, str], last: bool):
        movers, options = [], []
        for t, s in states.items():
            end = self.ranges[t][1]
            if end == k and not (last and t in self.machine.survivors):
                continue  # dies after k
            reads, writes = self.modes[t]
            opts = _transitions(s, k, reads, writes, last, self.gadgets[t])
            if last and (t in {z for _, z in self.machine.steady_pairs}):
                opts = [o for o in opts if o.state != F1]
            movers.append(t)
            options.append(opts)
        born = [] if last else self.births(k + 1)
        for t in born:
            movers.append(t)
            options.append(self.start_options(t))
        for combo in itertools.product(*options):
            yield ({t: o.state for t, o in zip(movers, combo, strict=True)},
                   tuple((t, e) for t, o in zip(movers, combo, strict=True) for e in o.events))

    def _step_cost(self, k: int, states: dict[int, str], async_reads: frozenset[int],
                   events: tuple) -> float:
        """Step k: its kernel with overlapped copies, plus its blocking write-evictions."""
        copies = [(t, FAST) for t in async_reads]
        sync = 0.0
        for t, (kind, kernel, mode) in events:
            if kind != "evict" or kernel != k:
                continue
            if mode == "async":
                copies.append((t, SLOW))
            else:
                sync += self.machine.copy_time(t, SLOW, "sync")
        kernel_s = self.machine.kernel_time(k, self.placement(k, states))
        return self.machine.step_time(kernel_s, copies) + sync

    def _steady(self, starts: tuple, end_states: dict[int, str]) -> bool:
        start = dict(starts)
        for first, last in self.machine.steady_pairs:
            if first in start and end_states.get(last) != start[first]:
                return False
        return True

    # ---- reconstruction --------------------------------------------------------------------
    def _plan(self, history: list[dict], final_key: tuple) -> Plan:
        keys, events = [final_key], []
        for back in reversed(history):
            _, prev, ev = back[keys[-1]]
            events.append(ev)
            keys.append(prev)
        return self._to_plan(list(reversed(keys[:-1])), list(reversed(events)), keys[-1])

    def _to_plan(self, keys: list, steps: list, first_key: tuple) -> Plan:
        machine, b = self.machine, ScheduleBuilder(self.n)
        first_states = dict(first_key[0])
        for t, g in self.gadgets.items():
            if g.given:
                b.initial[t] = (FAST,) if first_states[t] == F0 else (SLOW,)
        for t in machine.pinned:
            if machine.graph.tensors[t].producer is None:
                b.initial[t] = (FAST,)
        init_events = [ev for ev in _initial_events(first_states, self)]
        per_kernel_states = [first_states] + [dict(k[1] if k[0] == "end" else k[0])
                                              for k in keys]
        regens: dict[tuple[int, int], list[int]] = {}
        for t, (kind, kernel, mode) in init_events + [e for ev in steps for e in ev]:
            if kind == "read":
                b.read(t, kernel, mode)
            elif kind == "evict":
                b.evict(t, kernel, mode)
            elif kind == "regen":
                regens.setdefault((machine.graph.tensors[t].producer, kernel), []).append(t)
            else:  # drop or discard
                b.free(t, FAST, kernel)
        for (pid, kernel), outputs in regens.items():
            b.recompute(pid, tuple(sorted(outputs)), kernel)
        for k in range(self.n):
            b.compute(k, self.placement(k, per_kernel_states[k]))
        self._free_dead(b, per_kernel_states)
        return to_plan(machine, b, self.strategy, config={"device": machine.costs.device})

    def _free_dead(self, b: ScheduleBuilder, per_kernel: list[dict[int, str]]) -> None:
        for t in self.gadgets:
            end = self.ranges[t][1]
            if t in self.machine.survivors:
                continue
            state = per_kernel[end].get(t, X)
            if state in FASTISH:
                b.free(t, FAST, end)
            if state in (F1, S):
                b.free(t, SLOW, end)


def _initial_events(states: dict[int, str], bf: BruteForce) -> list:
    """Reads at kernel 0 of given tensors that start slow and are in F1 during kernel 0."""
    out = []
    for t, s in states.items():
        g = bf.gadgets[t]
        if g.given and s == F1:
            out.append((t, ("read", 0, MODE_NAMES[bf.modes[t][0][0]])))
    return out


__all__ = ["ASYNC", "SYNC", "BruteForce"]
