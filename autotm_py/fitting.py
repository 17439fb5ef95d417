"""The arena's fit loop (`fit_arena`): solve, pack the plan's buffers into the arena and, while
the packing exceeds the budget, solve again with the excess held back; a local search of the
packed plan's neighbourhoods follows where it applies (`planning.local_search`), kept where the
simulator predicts it faster. `pipeline.optimize` runs it for every arena plan.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from autotm_py import arena
from autotm_py.machine import MachineModel
from autotm_py.memory.accounting import ALIGN_BYTES
from autotm_py.plan import Plan
from autotm_py.planning import local_search, solve
from autotm_py.planning.control import SolveControl
from autotm_py.planning.solve import PlanResult
from autotm_py.runtime.simulate import Simulator
from autotm_py.units import format_bytes

if TYPE_CHECKING:
    from autotm_py.config import PlanConfig

# The fit loop: solves at most this many times; each retry holds back the last packing's excess
# plus this share of the arena's limit.
ARENA_SOLVES = 4
ARENA_SLACK = 0.002
# Graphs of this many kernels or more are first planned with this share of the arena held back
# (a re-solve of theirs repeats minutes of search; docs/planning.md, "Neighbourhood search").
# 3% until the skyline packing (`arena.packing.skyline`) packed such plans within 0.02% of
# their live peak: 0.5% gave a 3.3B decoder's plan at 24 GiB 2.5% less predicted time
# (docs/planning.md, "The skyline packing").
FIRST_FIT_MARGIN_KERNELS = 1000
FIRST_FIT_MARGIN = 0.005


def fit_arena(machine: MachineModel, config: PlanConfig, control: SolveControl | None = None
              ) -> tuple[PlanResult, MachineModel]:
    """Solve, pack the plan's buffers (`arena.pack`) and, while the arena exceeds the budget
    (tensors beyond their live sum: the packing's holes), solve again with the excess held
    back (`MachineModel.arena_margin`); at most `ARENA_SOLVES` solves, none after a stop
    request (`control`). The result's plan has its arena, unverified; a plan that never fits
    keeps none and runs on torch's allocator (a note says why). Returns the result and the
    machine of its last solve."""
    limit = machine.arena_limit
    notes: list[str] = []
    last: tuple[PlanResult, MachineModel] | None = None
    if limit is not None and len(machine.graph.kernels) >= FIRST_FIT_MARGIN_KERNELS:
        machine = replace(machine, arena_margin=machine.arena_margin +
                          int(FIRST_FIT_MARGIN * limit) // ALIGN_BYTES * ALIGN_BYTES)
    for attempt in range(1, ARENA_SOLVES + 1):
        if last is not None and control is not None and control.stop_requested:
            notes.append("no arena: stopped before the packing fitted; the plan runs on "
                         "torch's caching allocator")
            return noted(*last, notes)
        result = solve.plan(machine, config if last is None or control is None else
                            config.time_left(control.progress.elapsed_s), control,
                            local=False)
        if result.plan is None:
            if last is None:
                return result, machine
            notes.append(solve.packing_note(result))
            return noted(*last, notes)
        try:
            layout = arena.pack(machine, result.plan, limit=limit)
        except arena.ArenaError as exc:
            return noted(result, machine, [*notes, f"no arena: {exc}"])
        excess = 0 if limit is None else layout.nbytes - limit
        if excess <= 0:
            improved = local_search.improve_packed(machine, config, result, layout, control,
                                                   notes)
            result, layout = _predicted_faster(machine, (result, layout), improved, notes)
            notes.append(_arena_note(layout, machine, attempt))
            plan = result.plan.with_arena(layout).with_header(counts={
                **result.plan.header.counts, "arena_bytes": layout.nbytes,
                "arena_scratch_bytes": layout.scratch_bytes})
            return noted(replace(result, plan=plan, local=None), machine, notes)
        assert limit is not None and machine.tensor_budget is not None
        notes.append(f"arena: packed {format_bytes(layout.nbytes)} over the "
                     f"{format_bytes(limit)} it may use; solved again")
        last = (result, machine)
        # the next plan's live bytes must fall by the excess (the packing's holes) below this
        # plan's, which may lie under the budget already
        live = arena.lifetimes(machine, result.plan).live_peak()
        target = live - excess - max(int(limit * ARENA_SLACK), ALIGN_BYTES)
        machine = replace(machine, arena_margin=machine.arena_margin + max(
            machine.tensor_budget - target, excess))
    notes.append(f"no arena: the packing did not fit in {ARENA_SOLVES} solves; the plan runs "
                 "on torch's caching allocator")
    assert last is not None
    return noted(*last, notes)


def _predicted_faster(machine: MachineModel,
                      packed: tuple[PlanResult, arena.ArenaLayout],
                      improved: tuple[PlanResult, arena.ArenaLayout], notes: list[str]
                      ) -> tuple[PlanResult, arena.ArenaLayout]:
    """The local search's packed plan (`improved`) where the simulator predicts it faster
    than the plan it started from (`packed`), else that one (a note says so): the ILP's
    objective only models the time, and on the quick start's ResNet-50 a plan 0.02% better in
    it was predicted 0.5% slower (194.074 against 193.133 ms, 2026-12-08)."""
    if improved[0].plan is packed[0].plan:
        return improved
    times = [_predicted_s(machine, r.plan.with_arena(layout))  # type: ignore[union-attr]
             for r, layout in (packed, improved)]
    if times[1] < times[0]:
        return improved
    notes.append(f"arena: the local search's plan was predicted at {times[1] * 1e3:.3f} ms, "
                 f"the plan before it {times[0] * 1e3:.3f} ms; that one is kept")
    return packed


def _predicted_s(machine: MachineModel, plan: Plan) -> float:
    sim = Simulator(machine.graph, plan, machine, strict=False)
    sim.run()
    return sim.result().total_s


def _arena_note(layout: arena.ArenaLayout, machine: MachineModel, solves: int) -> str:
    windows = len(layout.windows())
    among = f" and {windows} scratch windows" if windows else ""
    return (f"arena: {format_bytes(layout.nbytes)} (tensors{among} "
            f"{format_bytes(layout.scratch_offset)}, scratch {format_bytes(layout.scratch_bytes)})"
            f" of {format_bytes(machine.arena_limit or 0)}"
            + (f", after {solves} solves holding back {format_bytes(machine.arena_margin)}"
               if solves > 1 else ""))


def noted(result: PlanResult, machine: MachineModel, notes: list[str]
          ) -> tuple[PlanResult, MachineModel]:
    """`result` with `notes` added to its plan's header (as it is where it has no plan)."""
    if result.plan is None or not notes:
        return result, machine
    return replace(result, plan=result.plan.with_header(
        notes=(*result.plan.header.notes, *notes))), machine
