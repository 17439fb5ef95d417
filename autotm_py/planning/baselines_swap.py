"""On-demand swapping with least-recently-used eviction (the ``lru`` and ``2lm`` baselines).

Each iteration starts with every placeable given tensor in the slow tier. Before kernel k, its
missing inputs are copied in (blocking) and, when the fast tier lacks room for them, for k's
outputs and for its workspace, the least recently used tensors that k does not touch are
evicted: dropped if their slow copy is valid, else written back first. At the end of the
iteration, carried tensors go back to the slow tier so that the next iteration starts alike.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

from autotm_py.errors import AutoTMError
from autotm_py.memory.tiers import FAST, SLOW
from autotm_py.planning.schedule import ScheduleBuilder, to_plan

if TYPE_CHECKING:
    from autotm_py.machine import MachineModel
    from autotm_py.plan import Plan


class _Cache:
    """Fast-tier contents in recency order, the bytes they hold, and valid slow copies."""

    def __init__(self, machine: MachineModel, builder: ScheduleBuilder) -> None:
        self.machine = machine
        self.b = builder
        self.fast: OrderedDict[int, None] = OrderedDict()
        self.has_slow: set[int] = set()
        self.used = 0

    def size(self, tid: int) -> int:
        return int(self.machine.sizes[tid])

    def add(self, tid: int) -> None:
        self.fast[tid] = None
        self.used += self.size(tid)

    def evict(self, tid: int, after: int) -> None:
        if tid in self.has_slow:
            self.b.free(tid, FAST, after)
        else:
            self.b.evict(tid, after)
            self.has_slow.add(tid)
        del self.fast[tid]
        self.used -= self.size(tid)

    def make_room(self, need: int, keep: set[int], kid: int) -> None:
        budget = self.machine.tensor_budget
        if budget is None:
            return
        victims = (t for t in list(self.fast) if t not in keep)
        while self.used + need > budget:
            victim = next(victims, None)
            if victim is None:
                raise AutoTMError(f"kernel #{kid} needs {need} bytes of fast memory beyond "
                                  f"what it keeps; the budget is {budget} bytes")
            self.evict(victim, kid - 1)


def lru_plan(machine: MachineModel, name: str = "lru") -> Plan:
    """The LRU on-demand swapping plan (see the module docstring)."""
    graph = machine.graph
    b = ScheduleBuilder(len(graph.kernels))
    cache = _Cache(machine, b)
    for t in graph.tensors:
        if t.producer is None:
            b.initial[t.id] = (FAST,) if t.id in machine.pinned else (SLOW,)
            cache.has_slow.add(t.id)
    for kid, kernel in enumerate(graph.kernels):
        _step(cache, kid)
        b.compute(kid, (FAST,) * len(kernel.io))
    last = len(graph.kernels) - 1
    for _, end in machine.steady_pairs:
        if end in cache.fast:
            cache.evict(end, last)
    return to_plan(machine, b, name, config={"baseline": name, "device": machine.costs.device})


def _step(cache: _Cache, kid: int) -> None:
    """Copy kernel `kid`'s missing inputs in, making room first; then free what dies."""
    machine, b = cache.machine, cache.b
    kernel = machine.graph.kernels[kid]
    io = [t for t in dict.fromkeys(kernel.io) if t not in machine.pinned]
    missing = [t for t in dict.fromkeys(kernel.inputs) if t in io and t not in cache.fast]
    outputs = [t for t in kernel.outputs if t not in machine.pinned]
    need = sum(cache.size(t) for t in missing + outputs) + int(machine.workspace[kid])
    cache.make_room(need, set(io), kid)
    for t in missing:
        b.read(t, kid)
        cache.add(t)
    for t in outputs:
        cache.add(t)
    for t in io:
        cache.fast.move_to_end(t)
        if machine.live_ranges[t][1] == kid and t not in machine.survivors:
            b.free(t, FAST, kid)
            cache.used -= cache.size(t)
            del cache.fast[t]
            if t in cache.has_slow:
                b.free(t, SLOW, kid)
