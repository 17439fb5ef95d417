"""`Simulator`: the predicted timeline and memory curve of a plan; in strict mode, the verifier.

Streams: one compute stream, and copy streams from `MemorySystem.stream_of`: GPU mode has one
engine per direction (``h2d``, ``d2h``) that overlap with compute and with each other; host mode
has one copy thread (``copy``) that both directions share, as in AutoTM's runtime.

Timing rules (the ILP's objective uses the same ones, through `MachineModel`, except the host
clock of the last rule):
- a sync move blocks compute: it starts when the compute stream and its copy stream are free;
- async moves attached to kernel k (records before ``Compute(k)``) start when k starts (and
  their stream is free), and run in record order on their stream. The compute stream waits
  for one only where its tensor is next used (the executor's joins): a read into fast memory
  (a prefetch) before a kernel or re-run that reads the tensor, a write or a free of it; a
  write to the slow tier before the free of its source, a kernel that may write over it
  (`memory.scratch.OVERWRITES`), or a read of the slow copy (which also starts no earlier).
  With a both-directions bandwidth (GPU), copies of the two engines share it: if a step's
  bytes need longer than either engine alone, both are stretched evenly, the fluid lower
  bound of bytes / both_directions_bw. (AutoTM's runtime, and the ILP's objective, join a
  step's copies at its end instead: an upper bound on this timeline.)
- a ``Fill`` is a kernel on the compute stream that writes its tensor's bytes at the fast
  tier's write bandwidth (`MachineModel.fill_time`);
- a kernel lasts `MachineModel.kernel_time` for its placement; a ``Recompute`` re-runs its
  kernel on the compute stream before the step's kernel (and before its async copies start),
  for the kernel's all-fast time;
- GPU mode, where profiles give device times (`KernelCosts.device_s`): the host dispatches
  kernel after kernel at their profiled times (launch gaps included) and never waits; a kernel
  lasts its device time and ends no earlier than its dispatch does. While copies hold the GPU
  back the host runs ahead, so launch gaps stop counting. Without device times, or without
  copies, this is the plain sum above.

Memory rules: a tensor occupies its aligned size in a tier from the record that creates the
copy (a move's destination is taken when the move is issued; an output when its kernel starts)
until the record that frees it (a fast copy read by a still-running async copy is released at
the end of the step). Workspace counts while its kernel runs. A ``Recompute`` makes every
output of its kernel for the length of the re-run (with the kernel's workspace): the ones it
keeps stay, the others are dropped at once. Pinned tensors are outside the
budget. Strict mode raises `PlanError` at the first violation, naming the record.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from autotm_py import arena
from autotm_py.errors import PlanError
from autotm_py.interpreter import PlanInterpreter
from autotm_py.ir.host_updates import offloaded_updates
from autotm_py.machine import MachineModel
from autotm_py.memory.accounting import aligned_sizes
from autotm_py.memory.scratch import OVERWRITES
from autotm_py.memory.tiers import FAST, SLOW
from autotm_py.plan import (
    INITIAL,
    NON_REPRODUCIBLE_OPS,
    SCRATCH,
    TIER_CODES,
    ArenaBuffer,
    Compute,
    Fill,
    Free,
    Move,
    Plan,
    Recompute,
)
from autotm_py.runtime.simulate_result import (
    KernelSpan,
    MoveSpan,
    RecomputeSpan,
    SimulationResult,
)

if TYPE_CHECKING:
    from autotm_py.ir.graph import Kernel, TensorGraph

ABSENT, READY, ARRIVING = 0, 1, 2
TIER_INDEX = {FAST: 0, SLOW: 1}


@dataclass
class _Step:
    """Async moves issued for the next kernel, and fast copies to release when it ends."""

    moves: list[tuple[int, Move]] = field(default_factory=list)
    release: list[tuple[int, str]] = field(default_factory=list)


class Simulator(PlanInterpreter):
    """Walks a plan, predicting times and bytes; `strict` raises at the first violation."""

    def __init__(self, graph: TensorGraph, plan: Plan, machine: MachineModel, *,
                 strict: bool = True, join_at_use: bool = True) -> None:
        super().__init__(graph, plan)
        self.machine = machine
        self.strict = strict
        # False: AutoTM's join of a step's copies at its end, the ILP's timeline (an upper
        # bound of the default, which follows the executor)
        self.join_at_use = join_at_use
        n = len(graph.tensors)
        self.state = np.zeros((n, 2), dtype=np.int8)  # [tensor, fast|slow] -> ABSENT/READY/...
        self.produced = np.zeros(n, dtype=bool)
        self.slow_sizes = aligned_sizes(graph)
        self.bytes = [0, 0]
        self.clock = 0.0  # the compute stream (the GPU clock)
        self.host = 0.0  # when the host starts dispatching the next kernel (see compute)
        self.stream_free: dict[str, float] = {}
        self.step = _Step()
        self.kernels: list[KernelSpan] = []
        self.moves: list[MoveSpan] = []
        self.recomputes: list[RecomputeSpan] = []
        self.pending_before: list[int] = []  # `before` of the recomputes of the coming step
        self.points: list[tuple[int, float, int, int]] = []
        self.violations: list[str] = []
        self.peak = (0, -1)
        self.moved: dict[str, int] = {}
        # optimizer updates on the host, and when the GPU's own iteration ended
        self.host_update_s = self.host_end_s = self.gpu_end_s = 0.0
        self.filled = 0  # bytes written by Fill records
        layout = plan.arena
        self.slots = arena.SlotMap() if layout is not None else None
        self.offsets = layout.offsets() if layout is not None else {}
        self.scratch = {b.record: b for b in layout.buffers if b.tensor == SCRATCH} \
            if layout is not None else {}
        self.in_place: list[int] = []  # outputs of the running kernel that took an input's slot
        self.landing: dict[int, float] = {}  # prefetched tensor -> when its copy ends
        self.leaving: dict[int, float] = {}  # tensor written out -> when its copy ends
        # arena: slots freed while a copy out still reads them ([low, high), copy end); the
        # next tenant waits (the executor's `claim`); when a new copy may be written there
        self.busy: list[tuple[int, int, float]] = []
        self.slot_free: dict[int, float] = {}  # async prefetch -> when its slot is free

    # ---- bookkeeping ---------------------------------------------------------------------
    def violate(self, message: str) -> None:
        """Strict: raise (the interpreter prefixes the record). Else collect the violation."""
        inside = 0 <= self.index < len(self.plan.records)
        edge = "start of plan" if self.index < 0 else "end of plan"
        if self.strict:
            raise PlanError(message if inside else f"{edge}: {message}")
        where = f"record #{self.index} {self.describe(self.plan.records[self.index])}" \
            if inside else edge
        self.violations.append(f"{where}: {message}")

    def name(self, tid: int) -> str:
        return repr(self.graph.tensors[tid].name)

    def size(self, tid: int, tier: str = FAST) -> int:
        """Accounted bytes: aligned; pinned tensors count nothing in the fast budget."""
        return int(self.machine.sizes[tid] if tier == FAST else self.slow_sizes[tid])

    def alloc(self, tid: int, tier: str, state: int = READY) -> None:
        self.state[tid, TIER_INDEX[tier]] = state
        self.bytes[TIER_INDEX[tier]] += self.size(tid, tier)
        if tier == FAST and self.slots is not None and self.size(tid):
            self._place(tid)
            self._wait_for_slot(tid, state)

    def _wait_for_slot(self, tid: int, state: int) -> None:
        """The writer of the new fast copy of `tid` waits for copies out of the earlier tenants
        of its slot: the compute stream, or (a prefetch) its copy (`slot_free`)."""
        low = self.slots.where.get(tid) if self.busy and self.slots is not None else None
        if low is None:  # nothing still copied out, or no slot (`_place` said why)
            return
        if state == ARRIVING:
            self.slot_free[tid] = self._copied_out(low, low + self.size(tid))
        else:
            self._wait_for_range(low, low + self.size(tid))

    def _copied_out(self, low: int, high: int) -> float:
        """When the copies out of freed tenants of arena bytes [low, high) end (0: none)."""
        return max((end for lo, hi, end in self.busy if lo < high and low < hi), default=0.0)

    def _wait_for_range(self, low: int, high: int) -> None:
        """The compute stream writes arena bytes [low, high) next: it waits for the copies out
        of their freed tenants."""
        self.clock = max(self.clock, self._copied_out(low, high))
        self.busy = [b for b in self.busy if b[2] > self.clock]

    def release(self, tid: int, tier: str) -> None:
        self.bytes[TIER_INDEX[tier]] -= self.size(tid, tier)
        if tier == FAST and self.slots is not None:
            self.slots.remove(tid)

    def _place(self, tid: int) -> None:
        """Arena: the new fast copy of `tid` has an offset and overlaps no live copy."""
        assert self.slots is not None and self.plan.arena is not None
        offset = self.offsets.get((max(self.index, INITIAL), tid))
        if offset is None:
            self.violate(f"the fast copy of {self.name(tid)} made here has no offset in the "
                         "arena")
            return
        high = offset + self.size(tid)
        if high > self.plan.arena.scratch_offset:
            self.violate(f"the fast copy of {self.name(tid)} at [{offset}, {high}) reaches "
                         f"into the scratch region (from {self.plan.arena.scratch_offset})")
        for low, top, holders in self.slots.overlapping(offset, high):
            if (low, top) == (offset, high) and self._takes_slot_of(tid, holders):
                self.in_place.append(tid)
                continue
            other = self.name(min(holders))
            self.violate(f"the fast copy of {self.name(tid)} at [{offset}, {high}) overlaps "
                         f"the live copy of {other} at [{low}, {top})")
            return
        self.slots.add(offset, high, tid)

    def _takes_slot_of(self, tid: int, holders: set[int]) -> bool:
        """An output may take the slot of an input its kernel reads for the last time, and a
        view of its input's bytes the slot of that input, live or not (shared read-only,
        `arena._alias_views`)."""
        record = self.plan.records[self.index] if self.index >= 0 else None
        if not isinstance(record, Compute):
            return False
        kernel = self.graph.kernels[record.kernel]
        view = kernel.op_type in arena.SAME_BYTES_VIEWS
        return tid in kernel.outputs and any(
            h in kernel.inputs and (view or arena.frees_after(self.plan.records, self.index, h))
            for h in holders)

    def mark(self, time_s: float, extra: int = 0) -> None:
        fast = self.bytes[0] + extra
        self.points.append((self.index, time_s, fast, self.bytes[1]))
        if fast > self.peak[0]:
            self.peak = (fast, self.index)
        budget = self.machine.tensor_budget
        if budget is not None and fast > budget:
            self.violate(f"fast tier holds {fast} bytes, over the budget of {budget} bytes")

    # ---- handlers ------------------------------------------------------------------------
    def start(self) -> None:
        limit = self.machine.arena_limit
        layout = self.plan.arena
        if layout is not None and limit is not None and layout.nbytes > limit:
            self.violate(f"the arena of {layout.nbytes} bytes exceeds the {limit} bytes of the "
                         "budget that the plan's buffers may use")
        for t in self.graph.tensors:
            if t.producer is not None:
                continue
            tiers = (FAST,) if t.id in self.machine.pinned else self.plan.initial.get(t.id)
            if tiers is None:
                self.violate(f"given tensor {self.name(t.id)} has no initial tier in the plan")
                tiers = (SLOW,)
            for tier in tiers:
                self.alloc(t.id, tier)
            self.produced[t.id] = True
        self.mark(0.0)

    def move(self, rec: Move) -> None:
        tid, to = rec.tensor, rec.to
        src = SLOW if to == FAST else FAST
        if tid in self.machine.pinned:
            self.violate(f"tensor {self.name(tid)} is pinned in fast memory (--pin-weights) "
                         "and must not move")
        self._check_readable(tid, src, "move")
        if self.state[tid, TIER_INDEX[to]] != ABSENT:
            self.violate(f"tensor {self.name(tid)} is already in the {to} tier")
        if rec.mode == "async":
            self.alloc(tid, to, ARRIVING)
            self.step.moves.append((self.index, rec))
            self.mark(self.clock)
            return
        self.alloc(tid, to)
        self._await(tid, self.leaving if to == FAST else self.landing)
        stream = self.machine.memory.stream_of(to)
        start = max(self.clock, self.stream_free.get(stream, 0.0))
        end = start + self.machine.copy_time(tid, to, "sync")
        self.clock = self.stream_free[stream] = end
        self._record_move(self.index, rec, start, end, stream)
        self.mark(start)

    def free(self, rec: Free) -> None:
        tid, tier = rec.tensor, rec.tier
        slot = TIER_INDEX[tier]
        if self.state[tid, slot] != READY:
            what = "still arriving" if self.state[tid, slot] == ARRIVING else "not there"
            self.violate(f"free of {self.name(tid)} from the {tier} tier, where it is {what}")
            return
        self.state[tid, slot] = ABSENT
        if tier == FAST:
            self._await(tid, self.landing)
            low = self.slots.where.get(tid) if self.slots is not None else None
            if low is not None and tid in self.leaving:  # the slot's next tenant waits
                self.busy.append((low, low + self.size(tid), self.leaving.pop(tid)))
            else:
                self._await(tid, self.leaving)
        copying = any(m.tensor == tid and m.to != tier for _, m in self.step.moves)
        if copying:
            self.step.release.append((tid, tier))  # the async copy still reads it
        else:
            self.release(tid, tier)
        self.mark(self.clock)

    def fill(self, rec: Fill) -> None:
        """A fill kernel makes the fast copy: no copy between tiers, its bytes written at the
        fast tier's bandwidth on the compute stream."""
        tid = rec.tensor
        if tid in self.machine.pinned or self.state[tid, 0] != ABSENT:
            self.violate(f"fill of {self.name(tid)}: it is already in the fast tier")
            return
        self.produced[tid] = True
        self.alloc(tid, FAST)
        self._await(tid, self.leaving)
        start = self.clock
        self.clock = start + self.machine.fill_time(tid)
        self.filled += int(self.graph.tensor_bytes[tid])
        self.mark(start)

    def recompute(self, rec: Recompute) -> None:
        kid, kernel = rec.kernel, self.machine.rerun(rec.kernel)
        if kernel.op_type in NON_REPRODUCIBLE_OPS:
            self.violate(f"kernel #{kid} ({kernel.op_type}) is random: a re-run would not "
                         "reproduce its outputs")
        for tid in kernel.inputs:
            self._check_readable(tid, FAST, "recompute input")
        for tid in rec.outputs:
            if tid not in kernel.outputs:
                self.violate(f"tensor {self.name(tid)} is not an output of kernel #{kid}'s "
                             "re-run")
            elif not self.produced[tid]:
                self.violate(f"tensor {self.name(tid)} is regenerated before kernel #{kid} "
                             "first produced it")
            elif self.state[tid, 0] != ABSENT:
                self.violate(f"tensor {self.name(tid)} is regenerated while it is in the fast "
                             "tier")
            else:
                self.alloc(tid, FAST)
        if self.slots is not None and self.index in self.scratch:
            self._check_window(self.scratch[self.index])
        self._await_inputs(kernel, overwrites=False)
        dropped = sum(self.size(t) for t in kernel.outputs if t not in rec.outputs)
        profiled = self.machine.rerun_time(kid)
        self.host += profiled
        duration = self.machine.rerun_device_time(kid) if self.machine.gpu else profiled
        start = max(self.clock, self.host - duration)
        self.mark(start, extra=dropped + int(self.machine.workspace[kid]))
        self.clock = start + duration
        self.pending_before.append(rec.before)
        nbytes = int(sum(self.graph.tensor_bytes[t] for t in rec.outputs))
        self.recomputes.append(RecomputeSpan(self.index, kid, kernel.name, rec.before,
                                             tuple(rec.outputs), nbytes, start, self.clock))

    def compute(self, rec: Compute) -> None:
        kid, kernel = rec.kernel, self.graph.kernels[rec.kernel]
        stray = [m for _, m in self.step.moves if m.overlaps != kid]
        if stray:
            self.violate(f"async move of {self.name(stray[0].tensor)} overlaps kernel "
                         f"#{stray[0].overlaps} but stands before kernel #{kid}")
        wrong = [b for b in self.pending_before if b != kid]
        if wrong:
            self.violate(f"a recompute for kernel #{wrong[0]} stands before kernel #{kid}")
        self.pending_before = []
        if self.machine.gpu and SLOW in rec.placement:
            self.violate("GPU mode: every input and output must be in fast memory")
        for slot, tid in enumerate(kernel.inputs):
            self._check_readable(tid, rec.placement[slot], "input")
        for tid, tier in zip(kernel.outputs, rec.placement[len(kernel.inputs):], strict=True):
            self._create_output(tid, tier)
        if self.slots is not None:
            self._check_scratch(kid)
        # Two clocks: the host dispatches kernel after kernel, each taking its profiled time
        # (launch gaps included), and never waits for the GPU; the GPU runs a kernel for its
        # device time, ending no earlier than its dispatch ends (so a host-bound stretch
        # lasts its profiled sum, as it was measured). Without device times the two are equal
        # and this is the plain sum. Where copies hold the GPU back, the host runs ahead and
        # the launch gaps vanish (experiments/journal/gpu-2026-11.md, DenseNet-264).
        self._await_inputs(kernel, overwrites=True)
        profiled = self.machine.kernel_time(kid, rec.placement)
        self.host += profiled
        duration = self.machine.device_time(kid) if self.machine.gpu else profiled
        start = max(self.clock, self.host - duration)
        self.mark(start, extra=int(self.machine.workspace[kid]))
        step_end = self._run_copies(start, duration)
        code = "".join(TIER_CODES[p] for p in rec.placement)
        self.kernels.append(KernelSpan(kid, kernel.name, start, start + duration, step_end,
                                       code))
        self.clock = step_end

    def _check_scratch(self, kid: int) -> None:
        assert self.plan.arena is not None
        ends = {last for _, last in self.graph.carried}
        view = self.graph.kernels[kid].op_type in arena.SAME_BYTES_VIEWS
        for tid in self.in_place:
            if tid not in ends and not view:
                self.violate(f"output {self.name(tid)} takes an input's slot in place, which "
                             "only an output that ends a carried pair, or a view of the "
                             "input's bytes (`arena.SAME_BYTES_VIEWS`), may")
        self.in_place = []
        need = int(self.machine.scratch[kid])
        have = self.scratch.get(self.index)
        if need and (have is None or have.nbytes < need):
            self.violate(f"the kernel needs {need} bytes of scratch, the arena gives it "
                         f"{0 if have is None else have.nbytes}")
        elif have is not None:
            self._check_window(have)

    def _check_window(self, have: ArenaBuffer) -> None:
        """A scratch buffer below the scratch region is a window (`--scratch windows`): no
        live fast copy may meet it while its kernel runs. Where a freed copy there is still
        copied out, the kernel waits for that copy, as the next tenant of a slot does (the
        executor's `claim`): the packer holds such a copy only to the join of the step its
        copy overlaps, and a copy joined at a later use may outlast that."""
        layout, slots = self.plan.arena, self.slots
        assert layout is not None and slots is not None
        if have.offset >= layout.scratch_offset or not have.nbytes:
            return
        low, high = have.offset, have.offset + have.nbytes
        clash = next(iter(slots.overlapping(low, high)), None)
        if not self.machine.windowed:
            self.violate(f"the kernel's scratch at {low} lies below the scratch region (from "
                         f"{layout.scratch_offset}), a window, but the plan was not made for "
                         "scratch windows")
        elif clash is not None:
            lo, hi, holders = clash
            self.violate(f"the kernel's scratch window [{low}, {high}) overlaps the live copy "
                         f"of {self.name(min(holders))} at [{lo}, {hi})")
        else:
            self._wait_for_range(low, high)

    def _check_steady_slots(self) -> None:
        """Arena: a tensor in fast memory at both ends ends in the slot where it started, or
        is one of the pairs copied at the boundary (both copies live at once)."""
        assert self.slots is not None
        boundary: frozenset[tuple[int, int]] | None = None
        for first, last in self.machine.steady_pairs:
            begin = self.offsets.get((INITIAL, first))
            end = self.slots.where.get(last)
            if begin is not None and end is not None and begin != end:
                if boundary is None:
                    boundary = arena.lifetimes(self.machine, self.plan).boundary
                if (first, last) in boundary:
                    continue
                self.violate(f"{self.name(last)} ends the iteration at offset {end} of the "
                             f"arena, but {self.name(first)} starts it at {begin}")

    def finish(self) -> None:
        # the iteration ends when every stream has (the executor joins them all)
        self.clock = max([self.clock, *self.stream_free.values()])
        if self.slots is not None:
            self._check_steady_slots()
        if self.step.moves:
            self.violate("async moves after the last kernel overlap nothing")
        if self.pending_before:
            self.violate("a recompute after the last kernel regenerates for nothing")
        ends = {t: tuple(tier for tier in (FAST, SLOW) if self.state[t, TIER_INDEX[tier]])
                for _, t in self.machine.steady_pairs}
        for first, last in self.machine.steady_pairs:
            begin = tuple(self.plan.initial.get(first, ()))
            if ends[last] != begin:
                self.violate(f"carried tensor {self.name(last)} ends in {list(ends[last])} but "
                             f"{self.name(first)} started in {list(begin)}; the next "
                             "iteration could not reuse the plan")
        for t in range(len(self.graph.tensors)):
            if self.state[t].any() and t not in self.machine.survivors and \
                    t not in self.machine.pinned:
                self.violate(f"tensor {self.name(t)} is never freed after its last use")
                break
        self._host_updates()

    def _host_updates(self) -> None:
        """The optimizer updates the host runs (`ir.host_updates`, `trainer.host`), in the
        order the GPU makes their gradients: each starts when its gradient's copy out and the
        last copy in of its fed weight have ended (it writes the next iteration's value over
        that copy's source) and the host is done with the one before; the next iteration
        starts when the last has (the Trainer waits for it: it reads the weights they
        write)."""
        by_name = self.graph.tensor_ids_by_name
        self.gpu_end_s = self.clock
        written = {m.tensor: m.end_s for m in self.moves if m.to == SLOW}
        read: dict[int, float] = {}
        for m in self.moves:
            if m.to == FAST:
                read[m.tensor] = max(read.get(m.tensor, 0.0), m.end_s)
        for tid in self.machine.fed:
            if tuple(self.plan.initial.get(tid, ())) != (SLOW,):
                self.violate(f"tensor {self.name(tid)} is written by the host before each "
                             "iteration and must start in the slow tier only")
        host = 0.0
        for update in offloaded_updates(self.graph):
            grad = by_name[update.grad]
            if self.state[grad, TIER_INDEX[FAST]] or not self.state[grad, TIER_INDEX[SLOW]]:
                self.violate(f"gradient {update.grad} is read by the host after the iteration "
                             "and must end in the slow tier only")
            work = self.machine.memory.host_update_s(update.numel)
            self.host_update_s += work
            ready = max(written.get(grad, 0.0), read.get(by_name[update.weight], 0.0))
            host = max(host, ready) + work
        self.host_end_s = host
        self.clock = max(self.clock, host)

    # ---- helpers -------------------------------------------------------------------------
    def _check_readable(self, tid: int, tier: str, what: str) -> None:
        t = self.graph.tensors[tid]
        if not self.produced[tid]:
            self.violate(f"{what} {self.name(tid)} is read before kernel #{t.producer} "
                         "produces it")
            return
        state = self.state[tid, TIER_INDEX[tier]]
        if state == READY or (tier == FAST and tid in self.machine.pinned):
            return
        if not self.state[tid].any():
            self.violate(f"{what} {self.name(tid)} is read after it was freed (absent: in "
                         "no tier, and not regenerated)")
        elif state == ARRIVING:
            self.violate(f"{what} {self.name(tid)} is read from the {tier} tier while its "
                         "async copy is still running")
        else:
            self.violate(f"{what} {self.name(tid)} is not resident in the {tier} tier")

    def _create_output(self, tid: int, tier: str) -> None:
        if self.produced[tid]:
            self.violate(f"output {self.name(tid)} is produced twice")
        self.produced[tid] = True
        if tid in self.machine.pinned:
            self.state[tid, 0] = READY
            return
        self.alloc(tid, tier)

    def _await_inputs(self, kernel: Kernel, overwrites: bool) -> None:
        """Before a kernel (or a re-run) reads its inputs: their prefetches have landed, and
        where it may write over them (`overwrites`: the inputs at its `OVERWRITES` positions),
        their copies out have ended."""
        over = OVERWRITES.get(kernel.op_type, ()) if overwrites else ()
        for position, tid in enumerate(kernel.inputs):
            self._await(tid, self.landing)
            if position in over:
                self._await(tid, self.leaving)

    def _await(self, tid: int, copies: dict[int, float]) -> None:
        """The compute stream waits for the copy of `tid` in `copies` (`landing` or `leaving`)
        if it is still running: the executor's join where the tensor is next used."""
        end = copies.pop(tid, None)
        if end is not None and end > self.clock:
            self.clock = end

    def _run_copies(self, start: float, duration: float) -> float:
        """Lay the step's async copies on their streams, each after the copies before it on
        its stream; return the step's end: the kernel's (each copy is joined at its use,
        `landing` and `leaving` keep when it ends), or with `join_at_use` off the last copy's
        too (the join at the end of the step)."""
        moves = self.step.moves
        memory = self.machine.memory
        copies = [(m.tensor, m.to) for _, m in moves]
        lanes: dict[str, float] = {}
        plan = []
        for idx, m in moves:
            stream = memory.stream_of(m.to)
            seconds = self.machine.copy_time(m.tensor, m.to, "async")
            plan.append((idx, m, stream, seconds))
            lanes[stream] = lanes.get(stream, 0.0) + seconds
        stretch = 1.0
        if lanes and max(lanes.values()) > 0:  # the shared link may bind: stretch both lanes
            stretch = max(1.0, self.machine.step_time(0.0, copies) / max(lanes.values()))
        step_end = start + duration
        for idx, m, stream, seconds in plan:
            # after the copies before it on its stream, and after the copy that makes its
            # source (a write of a tensor still landing, a read of one still being written)
            source = self.landing if m.to == SLOW else self.leaving
            begin = max(start, self.stream_free.get(stream, 0.0), source.get(m.tensor, 0.0),
                        self.slot_free.pop(m.tensor, 0.0))
            end = begin + seconds * stretch
            self._record_move(idx, m, begin, end, stream)
            self.stream_free[stream] = end
            self.state[m.tensor, TIER_INDEX[m.to]] = READY
            if self.join_at_use:
                (self.landing if m.to == FAST else self.leaving)[m.tensor] = end
            else:
                step_end = max(step_end, end)
        for tid, tier in self.step.release:
            self.release(tid, tier)
        self.step = _Step()
        return step_end

    def _record_move(self, idx: int, m: Move, start: float, end: float, stream: str) -> None:
        nbytes = int(self.graph.tensor_bytes[m.tensor])
        self.moves.append(MoveSpan(idx, m.tensor, self.graph.tensors[m.tensor].name, m.to,
                                   m.mode, start, end, nbytes, m.overlaps, stream))
        key = f"to_{m.to}_{m.mode}"
        self.moved[key] = self.moved.get(key, 0) + nbytes

    def result(self) -> SimulationResult:
        cols = list(zip(*self.points, strict=True)) if self.points else [(), (), (), ()]
        memory = {"record": cols[0], "time_s": cols[1], "fast_bytes": cols[2],
                  "slow_bytes": cols[3]}
        pinned = int(sum(self.graph.tensor_bytes[t] for t in self.machine.pinned))
        return SimulationResult(
            model_name=self.graph.name, strategy=self.plan.header.strategy,
            mode=self.machine.memory.mode, total_s=self.clock,
            all_fast_s=self.machine.all_fast_time, budget_bytes=self.machine.user_budget,
            fast_peak_bytes=self.peak[0], fast_peak_record=self.peak[1],
            slow_peak_bytes=int(max(cols[3], default=0)), pinned_bytes=pinned,
            kernels=tuple(self.kernels), moves=tuple(self.moves), memory=memory,
            bytes_moved=dict(self.moved), violations=tuple(self.violations),
            strict=self.strict, notes=tuple(self.plan.header.notes),
            recomputes=tuple(self.recomputes),
            reserve_bytes=self.machine.reserve_bytes, plannable_bytes=self.machine.tensor_budget,
            costs_digest=self.machine.profile_costs.digest, filled_bytes=self.filled,
            host_update_s=self.host_update_s, host_end_s=self.host_end_s,
            gpu_end_s=self.gpu_end_s)
