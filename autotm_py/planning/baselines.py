"""Baselines in the Plan format (DESIGN section 11); the simulator judges them
(`autotm_py.pipeline.run_baselines`, on `simulation_machine`).

- ``all-fast``: no budget, everything in fast memory: the ideal, whose time is the reference;
- ``all-slow``: host mode, every tensor lives in the slow tier and kernels read it there; GPU
  mode, every tensor lives in pinned host memory and is copied in before each use and out
  after it is produced (blocking);
- ``first-touch``: Linux NUMA first-touch (AutoTM's NUMA baseline): in tensor birth order, a
  tensor goes to fast memory if it fits there for its whole life, else to the slow tier for
  good. In GPU mode a slow tensor is used on demand as in all-slow, and room for the largest
  working set is kept free so that on-demand copies always fit;
- ``lru``: on-demand swapping with least-recently-used eviction (vDNN/Capuchin-like, no
  solver), starting each iteration with given tensors in the slow tier;
- ``offload``: offload every activation with a long gap between uses to the slow tier right
  after a use and prefetch it one kernel before the next use, both overlapped
  (``save_on_cpu``/torchtune activation offloading); it ignores the budget;
- ``2lm`` (host mode): DRAM as a hardware cache of the slow tier (Optane "Memory Mode"),
  modelled as `lru` whose fills and write-backs run at the slow tier's raw bandwidths.

Baseline plans pin tensors only when the planner does (``--pin-weights``). Steady state holds
for all of them: carried tensors end in the tier where they started.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from autotm_py.errors import ConfigError
from autotm_py.ir.graph import Role
from autotm_py.machine import MachineModel
from autotm_py.memory.tiers import FAST, SLOW, MemorySystem
from autotm_py.planning.baselines_swap import lru_plan
from autotm_py.planning.schedule import ScheduleBuilder, to_plan

if TYPE_CHECKING:
    from autotm_py.plan import Plan

BASELINES = ("all-fast", "all-slow", "first-touch", "lru", "offload", "2lm")


@dataclass(frozen=True)
class BaselineResult:
    """A baseline's plan and predicted time; infeasible when its plan breaks the budget."""

    name: str
    plan: Plan | None
    time_s: float | None
    feasible: bool
    fast_peak_bytes: int | None
    message: str = ""

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "time_s": self.time_s, "feasible": self.feasible,
                "fast_peak_bytes": self.fast_peak_bytes, "message": self.message}


def baseline_plan(machine: MachineModel, name: str) -> Plan:
    """The plan of baseline `name` (see the module docstring) for `model`'s budget."""
    builders = {"all-fast": all_fast, "all-slow": all_slow, "first-touch": first_touch,
                "lru": lru_plan, "offload": offload, "2lm": two_level}
    if name not in builders:
        raise ConfigError(f"unknown baseline {name!r}; baselines: {', '.join(BASELINES)}")
    return builders[name](machine)


def simulation_machine(machine: MachineModel, name: str) -> MachineModel:
    """The machine a baseline's plan is judged on: all-fast without a budget; 2lm on the
    hardware-cache memory system (`two_level_memory`); every other one on `model` itself."""
    if name == "2lm":
        return replace(machine, memory=two_level_memory(machine))
    if name == "all-fast":
        return replace(machine, memory=machine.memory.with_budget(None))
    return machine


# ---- all-fast and all-slow ---------------------------------------------------------------
def all_fast(machine: MachineModel) -> Plan:
    """Everything in fast memory, no moves; planned without a budget."""
    b = ScheduleBuilder(len(machine.graph.kernels))
    for t in machine.graph.tensors:
        if t.producer is None:
            b.initial[t.id] = (FAST,)
    _free_at_death(b, machine, lambda _: (FAST,))
    for kid, kernel in enumerate(machine.graph.kernels):
        b.compute(kid, (FAST,) * len(kernel.io))
    unlimited = replace(machine, memory=machine.memory.with_budget(None))
    return to_plan(unlimited, b, "all-fast", config=_config(machine, "all-fast"))


def all_slow(machine: MachineModel) -> Plan:
    """Every placeable tensor lives in the slow tier (see the module docstring)."""
    return _homes(machine, "all-slow", frozenset())


def first_touch(machine: MachineModel) -> Plan:
    """Fast while it fits for the tensor's whole life, else slow for good."""
    return _homes(machine, "first-touch", _first_touch_homes(machine))


def _homes(machine: MachineModel, name: str, fast_home: frozenset[int]) -> Plan:
    """A plan where tensors in `fast_home` (and pinned ones) stay fast and all others live in
    the slow tier: read directly (host) or copied in and out around each use (GPU)."""
    graph = machine.graph
    b = ScheduleBuilder(len(graph.kernels))
    fast = fast_home | machine.pinned
    for t in graph.tensors:
        if t.producer is None:
            b.initial[t.id] = (FAST,) if t.id in fast else (SLOW,)
    for kid, kernel in enumerate(graph.kernels):
        if machine.gpu:
            _on_demand(b, machine, kid, fast)
            b.compute(kid, (FAST,) * len(kernel.io))
        else:
            b.compute(kid, tuple(FAST if t in fast else SLOW for t in kernel.io))
    if not machine.gpu:
        _free_at_death(b, machine, lambda t: (FAST,) if t in fast else (SLOW,))
    return to_plan(machine, b, name, config=_config(machine, name))


def _on_demand(b: ScheduleBuilder, machine: MachineModel, kid: int, fast: frozenset[int]) -> None:
    """GPU: read slow inputs before kernel `kid`; after it, write back outputs that are still
    needed, and drop the fast copies of slow-home tensors (freeing those that die)."""
    kernel = machine.graph.kernels[kid]
    for tid in dict.fromkeys(kernel.inputs):
        if tid not in fast:
            b.read(tid, kid)
    for tid in dict.fromkeys(kernel.io):
        last = machine.live_ranges[tid][1]
        dies = last == kid and tid not in machine.survivors
        if tid in fast:
            if dies:
                b.free(tid, FAST, kid)
            continue
        produced_here = tid in kernel.outputs
        if dies:
            b.free(tid, FAST, kid)
            if not produced_here:
                b.free(tid, SLOW, kid)
        elif produced_here:
            b.evict(tid, kid)
        else:
            b.free(tid, FAST, kid)


def _first_touch_homes(machine: MachineModel) -> frozenset[int]:
    """Tensors (carried pairs together) that get a fast home, decided in birth order."""
    graph = machine.graph
    n = len(graph.kernels)
    budget = machine.tensor_budget if machine.tensor_budget is not None else 2**62
    reserve = machine.workspace.astype(np.int64).copy()
    if machine.gpu:
        reserve += np.array([machine.io_bytes(k) for k in range(n)], dtype=np.int64)
    usage = np.zeros(n, dtype=np.int64)
    partner = {a: z for a, z in graph.carried} | {z: a for a, z in graph.carried}
    homes: set[int] = set()
    decided: set[int] = set()
    order = sorted(range(len(graph.tensors)), key=lambda t: (machine.live_ranges[t][0], t))
    for tid in order:
        if tid in decided or tid in machine.pinned:
            continue
        group = [tid] + ([partner[tid]] if tid in partner else [])
        decided.update(group)
        add = np.zeros(n, dtype=np.int64)
        for t in group:
            start, end = machine.live_ranges[t]
            add[start:end + 1] += machine.sizes[t]
        if np.all(usage + add + reserve <= budget):
            usage += add
            homes.update(group)
    return frozenset(homes)


# ---- offload -----------------------------------------------------------------------------
def offload(machine: MachineModel) -> Plan:
    """Offload activations across long gaps between uses; prefetch one kernel ahead."""
    graph = machine.graph
    b = ScheduleBuilder(len(graph.kernels))
    for t in graph.tensors:
        if t.producer is None:
            b.initial[t.id] = (FAST,)
    slow_at_death: set[int] = set()
    for t in graph.tensors:
        if t.role != Role.ACTIVATION or t.id in machine.pinned or t.id in machine.survivors:
            continue
        uses = sorted({t.producer, *t.users} - {None})
        written = False
        for u, v in itertools.pairwise(uses):
            if v - u < 3:
                continue
            if written:
                b.free(t.id, FAST, u)
            else:
                b.evict(t.id, u + 1, "async")
                written = True
            b.read(t.id, v - 1, "async")
        if written:
            slow_at_death.add(t.id)
    _free_at_death(b, machine, lambda t: (FAST, SLOW) if t in slow_at_death else (FAST,))
    for kid, kernel in enumerate(graph.kernels):
        b.compute(kid, (FAST,) * len(kernel.io))
    return to_plan(machine, b, "offload", config=_config(machine, "offload"))


# ---- 2LM ---------------------------------------------------------------------------------
def two_level_memory(machine: MachineModel) -> MemorySystem:
    """The memory system as a hardware cache sees it: fills and write-backs at the slow
    tier's raw bandwidths, no copy software latency."""
    memory = machine.memory
    link = replace(memory.link, read_bw=memory.slow.read_bw, write_bw=memory.slow.write_bw,
                   latency_s=0.0)
    return replace(memory, name=f"{memory.name}-2lm", link=link)


def two_level(machine: MachineModel) -> Plan:
    """2LM: `lru` on the hardware-cache memory system (host mode only)."""
    if machine.gpu:
        raise ConfigError("the 2lm baseline models a host memory mode; it has no GPU meaning")
    cached = replace(machine, memory=two_level_memory(machine))
    return lru_plan(cached, name="2lm")


# ---- helpers -----------------------------------------------------------------------------
def _free_at_death(b: ScheduleBuilder, machine: MachineModel,
                   tiers: Callable[[int], tuple[str, ...]]) -> None:
    """Free every non-surviving tensor's copies (`tiers(tid)`) after its last use."""
    for t in machine.graph.tensors:
        if t.id in machine.survivors or t.id in machine.pinned:
            continue
        last = machine.live_ranges[t.id][1]
        for tier in tiers(t.id):
            b.free(t.id, tier, last)


def _config(machine: MachineModel, name: str) -> dict[str, object]:
    return {"baseline": name, "device": machine.costs.device}
