"""Planned addresses: every fast-memory buffer of a plan at an offset in one arena.

torch's caching allocator needs 5-25% more than a plan's live bytes (fragmentation, docs/gpu.md);
packed offline at planned offsets the same plans need 0-2% more. This module finds the buffers
of a plan and their lifetimes, and packs them (`pack`); the strict simulator checks that no two
live buffers overlap, and the executor serves them as views of one arena.

Lifetimes, in half-steps (record i spans [2i, 2i + 2)):

- a *buffer* is one fast copy of a tensor. It is created by the initial placement (at -2), by
  a Move to fast or by the Compute that produces it (at 2i), and dropped by the Free of that
  fast copy at record j (at 2j + 1, exclusive), or lives to the end of the iteration (2n). A
  fast copy read by an async copy to slow is held until the kernel that copy overlaps has
  ended (the join), even where the plan frees it earlier. A copy that runs on past that join
  (copies are joined at their use) is waited for by whoever writes those bytes next, a
  tensor's new copy or a kernel in its scratch window (the executor's `_claim`, the
  simulator's `_wait_for_range`);
- each Compute has a *scratch* buffer while its kernel runs, [2i, 2i + 1): the kernel's
  workspace plus the outputs that torch allocates itself before the executor copies them into
  their slots (`MachineModel.scratch`, `memory.scratch`). Kernels allocate scratch through
  torch's allocator, which cannot be told an address, so all scratch shares one region at the
  top of the arena, [scratch_offset, nbytes), as large as the largest kernel's. With scratch
  windows (`MachineModel.windowed`: the placed allocator serves each kernel's scratch from an
  address the executor names, `runtime.placed`) each compute's scratch of 1 MiB or more
  (`MachineModel.windows`) is instead a buffer of its own, packed among the tensors, and the
  region holds only the smaller ones: the memory a kernel's workspace takes while it runs
  holds tensors the rest of the iteration;
- steady state: a carried pair (W -> W') or a persistent tensor that is in fast memory when the
  iteration starts and when it ends keeps one offset across the boundary: the final copy of W'
  takes the slot of W's initial copy, so the next iteration (and a CUDA graph replaying it)
  finds it there. Where W' is made by the kernel that last reads W (the optimizer update), W'
  takes W's slot *in place*: the executor writes it through scratch and copies it into the slot
  after the kernel and its overlapped copies have finished (`in_place_outputs`). Where W is
  still read after W' is made (a weight freed a kernel after its update; a batch norm's re-run
  reads no running statistic, `ir.rerun`), the two live at once and cannot share a slot: W's
  slot is then held to the end of the iteration, W' keeps a slot of its own, and the executor
  copies W' into W's slot when the iteration ends (inside the timed and captured iteration,
  `Executor.finish`; `Lifetimes.boundary`);
- a view of its input's bytes (a reshape, `SAME_BYTES_VIEWS`) takes the input's slot too
  (`_alias_views`), shared read-only while either lives: the executor finds it there,
  uncopied;

Packing (`arena.packing`): every item (a buffer, or the two pieces of a steady pair) gets an
offset where it meets no item live at the same time, as tight as the search finds; offsets are
multiples of `ALIGN_BYTES`, as sizes are.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from autotm_py.arena.packing import extent, tightest_packing
from autotm_py.errors import PlanError
from autotm_py.interpreter import PlanInterpreter
from autotm_py.memory.accounting import ALIGN_BYTES
from autotm_py.memory.scratch import VIEW_OPS
from autotm_py.memory.tiers import FAST
from autotm_py.plan import (
    INITIAL,
    SCRATCH,
    ArenaBuffer,
    ArenaLayout,
    Compute,
    Fill,
    Free,
    Move,
    Plan,
    Recompute,
    Record,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from autotm_py.machine import MachineModel

class ArenaError(PlanError):
    """A plan whose buffers cannot be given steady offsets (see the module docstring)."""


@dataclass(frozen=True)
class Span:
    """One buffer's lifetime [start, end) in half-steps; `record`/`tensor` as `ArenaBuffer`."""

    record: int
    tensor: int
    start: int
    end: int
    nbytes: int

    def overlaps(self, other: Span) -> bool:
        return self.start < other.end and other.start < self.end


class _Lifetimes(PlanInterpreter):
    """Walks a plan and collects every fast buffer's span (see the module docstring)."""

    def __init__(self, machine: MachineModel, plan: Plan) -> None:
        super().__init__(machine.graph, plan)
        self.machine = machine
        self.open: dict[int, tuple[int, int]] = {}  # tensor -> (record, start) of its fast copy
        self.spans: list[Span] = []
        self.scratch: dict[int, int] = {}  # compute record -> bytes (before in-place outputs)
        self.windowed: set[int] = set()  # compute records whose scratch has a window
        self.sources: set[int] = set()  # fast copies that the coming step's async copies read
        self.held: list[tuple[int, int, int]] = []  # (tensor, record, start) freed while read

    def _open(self, tid: int, record: int) -> None:
        if int(self.machine.sizes[tid]) > 0 and tid not in self.open:
            self.open[tid] = (record, 2 * record)

    def _close(self, tid: int, record: int, start: int, end: int) -> None:
        self.spans.append(Span(record, tid, start, end, int(self.machine.sizes[tid])))

    def start(self) -> None:
        for tid, tiers in self.plan.initial.items():
            if FAST in tiers:
                self._open(tid, INITIAL)

    def move(self, record: Move) -> None:
        if record.to == FAST:
            self._open(record.tensor, self.index)
        elif record.mode == "async":
            self.sources.add(record.tensor)

    def fill(self, record: Fill) -> None:
        self._open(record.tensor, self.index)

    def compute(self, record: Compute) -> None:
        kernel = self.machine.graph.kernels[record.kernel]
        n_in = len(kernel.inputs)
        for j, tid in enumerate(kernel.outputs):
            if record.placement[n_in + j] == FAST:
                self._open(tid, self.index)
        self._scratch(record.kernel)
        end = 2 * self.index + 1  # the step's join: its async copies are done
        for tid, rec, start in self.held:
            self._close(tid, rec, start, end)
        self.held.clear()
        self.sources.clear()

    def recompute(self, record: Recompute) -> None:
        # the regenerated outputs are fast copies from here on; the re-run's workspace (and
        # the outputs it drops at once) is its scratch, as for the kernel's first run
        for tid in record.outputs:
            self._open(tid, self.index)
        self._scratch(record.kernel)

    def _scratch(self, kernel: int) -> None:
        self.scratch[self.index] = int(self.machine.scratch[kernel])
        if self.machine.windows[kernel]:
            self.windowed.add(self.index)

    def free(self, record: Free) -> None:
        if record.tier != FAST or record.tensor not in self.open:
            return
        rec, start = self.open.pop(record.tensor)
        if record.tensor in self.sources:
            self.held.append((record.tensor, rec, start))
        else:
            self._close(record.tensor, rec, start, 2 * self.index + 1)

    def finish(self) -> None:
        end = 2 * len(self.plan.records)
        for tid, rec, start in self.held:
            self._close(tid, rec, start, end)
        for tid, (rec, start) in self.open.items():
            self._close(tid, rec, start, end)


@dataclass(frozen=True)
class Lifetimes:
    """The buffers of a plan: tensor spans, per-compute scratch, the steady groups (spans
    that must share an offset), and the outputs that take an input's slot in place."""

    spans: tuple[Span, ...]
    scratch: dict[int, int]  # compute record -> scratch bytes
    groups: tuple[tuple[int, ...], ...]  # indices into spans that share one offset
    in_place: frozenset[tuple[int, int]]  # (compute record, output tensor)
    end: int  # 2 x the number of records
    # steady pairs (first, last) live at once: last is copied into first's slot between
    # iterations (module docstring)
    boundary: frozenset[tuple[int, int]] = frozenset()

    def live_peak(self) -> int:
        """The largest sum of tensor buffers live at once (what the ILP's rows bound), which
        no packing can beat. The spans of a group share one slot: it is counted once while
        any of them lives (a steady pair that left fast memory and came back: two pieces; an
        in-place update or a view: one)."""
        events: dict[int, int] = {}

        def hold(start: int, end: int, nbytes: int) -> None:
            events[start] = events.get(start, 0) + nbytes
            events[end] = events.get(end, 0) - nbytes

        grouped = {i for group in self.groups for i in group}
        for i, s in enumerate(self.spans):
            if i not in grouped:
                hold(s.start, s.end, s.nbytes)
        for group in self.groups:
            nbytes = self.spans[group[0]].nbytes
            for start, end in _union(sorted((self.spans[i].start, self.spans[i].end)
                                            for i in group)):
                hold(start, end, nbytes)
        live, peak = 0, 0
        for time in sorted(events):
            live += events[time]
            peak = max(peak, live)
        return peak


def _union(intervals: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted half-open intervals merged where they meet or overlap."""
    merged: list[tuple[int, int]] = []
    for start, end in intervals:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def lifetimes(machine: MachineModel, plan: Plan) -> Lifetimes:
    """Every fast buffer of `plan` with its lifetime (module docstring). A steady pair whose
    two copies live at once without being an in-place update is copied at the boundary."""
    walk = _Lifetimes(machine, plan)
    walk.run()
    spans = walk.spans
    index = {(s.record, s.tensor): i for i, s in enumerate(spans)}
    end = 2 * len(plan.records)
    final = {s.tensor: i for i, s in enumerate(spans) if s.end == end}
    groups: list[tuple[int, ...]] = []
    in_place: set[tuple[int, int]] = set()
    boundary: set[tuple[int, int]] = set()
    for first, last in machine.steady_pairs:
        a, z = index.get((INITIAL, first)), final.get(last)
        if a is None or z is None or a == z:
            continue  # not in fast memory at both ends, or one buffer all along
        head, tail = spans[a], spans[z]
        if head.nbytes != tail.nbytes:
            raise ArenaError(f"carried tensors {machine.graph.name_of(first)!r} and "
                             f"{machine.graph.name_of(last)!r} differ in size")
        if head.end > tail.start:
            if not _updates_in_place(plan, machine, tail, first):
                # both live at once: two slots, W's held to the end for the copy into it
                boundary.add((first, last))
                spans[a] = replace(head, end=end)
                continue
            in_place.add((tail.record, last))
        groups.append((a, z))
    _alias_views(machine, plan, spans, groups, in_place)
    # a window: the compute's scratch a buffer of its own, live while it runs; the rest share
    # the region
    scratch = {r: n for r, n in walk.scratch.items() if r not in walk.windowed}
    spans = spans + [Span(record, SCRATCH, 2 * record, 2 * record + 1, _aligned(n))
                     for record, n in sorted(walk.scratch.items())
                     if n > 0 and record in walk.windowed]
    return Lifetimes(tuple(spans), scratch, tuple(groups), frozenset(in_place), end,
                     frozenset(boundary))


# Ops whose torch kernels return their input's bytes in the same element order (a view of a
# row-major input, or the input itself): the views but the transposes.
SAME_BYTES_VIEWS = VIEW_OPS - {"Transpose", "TransposeGrad"}


def _alias_views(machine: MachineModel, plan: Plan, spans: list[Span],
                 groups: list[tuple[int, ...]], in_place: set[tuple[int, int]]) -> None:
    """A view of its input's bytes (`SAME_BYTES_VIEWS`, row-major, one dtype and size) takes
    the input's slot: its output is those bytes already, so the executor finds it in its slot
    and copies nothing (`Executor._in_slot`: `same_place`). Before, every such view was copied
    into a slot of its own (reshapes into and out of attention heads and their gradients: 7 a
    layer in GPT-2 small, whose step on an H200 made 184 device-to-device copies, 16 a layer in
    a Llama, 354 copies and 448 copy kernels; counted on the CPU in the Trainer's arena plans).

    The slot is shared read-only, so it holds as long as either lives (`Lifetimes.live_peak`
    counts the union once): where the input dies at the view (freed right after it, nothing
    reads it again: `frees_after`), and also where it lives on (the attention's output, which
    its backward reads, reshaped back to (B, L, H E)), as autograd's views share their base's
    storage. A chain of views (Reshape, Unsqueeze; a gradient's ReshapeGrad of a ReshapeGrad)
    is one group, all in one slot. Never in the slot of a steady pair's piece (whose slot the
    update writes in place, or the next iteration's value is copied into at the boundary), and
    a live input only where neither tensor is carried."""
    graph = machine.graph
    steady = {i for group in groups for i in group}
    carried = {t for pair in machine.steady_pairs for t in pair}
    group_of: dict[int, int] = {}  # a span in a view group -> that group's index in `groups`
    live: dict[tuple[int, int], int] = {(s.record, s.tensor): i for i, s in enumerate(spans)}
    by_tensor: dict[int, list[int]] = {}
    for i, s in enumerate(spans):
        by_tensor.setdefault(s.tensor, []).append(i)
    for index, record in enumerate(plan.records):
        if not isinstance(record, Compute):
            continue
        kernel = graph.kernels[record.kernel]
        if kernel.op_type not in SAME_BYTES_VIEWS or len(kernel.outputs) != 1 or \
                FAST not in record.placement[:1] or record.placement[-1] != FAST:
            continue
        src, out = kernel.inputs[0], kernel.outputs[0]
        a_in, b_out = graph.tensors[src], graph.tensors[out]
        if a_in.channels_last or b_out.channels_last or a_in.dtype != b_out.dtype or \
                a_in.nbytes != b_out.nbytes:
            continue
        if not frees_after(plan.records, index, src) and (src in carried or out in carried):
            continue
        z = live.get((index, out))
        a = next((i for i in by_tensor.get(src, ())
                  if spans[i].start <= 2 * index < spans[i].end), None)
        if a is None or z is None or a in steady or z in steady:
            continue
        if spans[a].nbytes != spans[z].nbytes or spans[z].start != 2 * index:
            continue
        if a in group_of:
            groups[group_of[a]] += (z,)
        else:
            group_of[a] = len(groups)
            groups.append((a, z))
        group_of[z] = group_of[a]
        in_place.add((index, out))


def _updates_in_place(plan: Plan, machine: MachineModel, tail: Span, first: int) -> bool:
    """`tail` is made by a Compute that reads `first`, whose fast copy is then freed before the
    next Compute with no record in between touching it (`frees_after`)."""
    record = plan.records[tail.record] if tail.record >= 0 else None
    if not isinstance(record, Compute):
        return False
    return first in machine.graph.kernels[record.kernel].inputs and \
        frees_after(plan.records, tail.record, first)


def frees_after(records: Sequence[Record], index: int, tid: int) -> bool:
    """Whether the records after `index` free the fast copy of `tid` before the next Compute,
    and none of them moves it first (nothing reads it once the kernel at `index` has run)."""
    for record in records[index + 1:]:
        if isinstance(record, Compute):
            return False
        if isinstance(record, Move) and record.tensor == tid:
            return False
        if isinstance(record, Free) and record.tensor == tid and record.tier == FAST:
            return True
    return False


def pack(machine: MachineModel, plan: Plan, limit: int | None = None) -> ArenaLayout:
    """Offsets for every fast buffer of `plan` (module docstring). The arena's size is the
    tensors' extent (scratch windows included) plus the largest scratch of a region; whether
    it fits the budget is the caller's. `limit`: the arena bytes the caller may use; the search
    stops at the first packing within it (the fit loop's: a tighter one gains it nothing)."""
    life = lifetimes(machine, plan)
    scratch = {r: _aligned(n) for r, n in sorted(life.scratch.items()) if n > 0}
    top = max(scratch.values(), default=0)
    offsets = tightest_packing(life, None if limit is None else limit - top)
    scratch_offset = _aligned(extent(life, offsets))
    buffers = [ArenaBuffer(s.record, s.tensor, offsets[i], s.nbytes)
               for i, s in enumerate(life.spans)]
    buffers.sort(key=lambda b: (b.record, b.tensor))
    region = [ArenaBuffer(r, SCRATCH, scratch_offset, n) for r, n in scratch.items()]
    return ArenaLayout(scratch_offset + top, scratch_offset, ALIGN_BYTES,
                       tuple(buffers + region))


def _aligned(n: int) -> int:
    return -(-int(n) // ALIGN_BYTES) * ALIGN_BYTES


def overlapping(layout: ArenaLayout, life: Lifetimes) -> tuple[Span, Span] | None:
    """Two buffers (tensors, scratch windows) that are live at once and overlap in the arena
    (in-place updates and the pieces of a steady group excepted), else None. A brute-force
    check for tests and reports; the strict simulator checks the same rule as it walks the
    plan."""
    offsets = {(b.record, b.tensor): b.offset for b in layout.buffers}  # windows included
    together = {frozenset((life.spans[a], life.spans[z]))
                for group in life.groups for a, z in itertools.combinations(group, 2)}
    spans = sorted(life.spans, key=lambda s: s.start)
    for i, s in enumerate(spans):
        lo = offsets[(s.record, s.tensor)]
        for t in spans[i + 1:]:
            if t.start >= s.end:
                break
            other = offsets[(t.record, t.tensor)]
            if lo < other + t.nbytes and other < lo + s.nbytes and s.nbytes and t.nbytes \
                    and frozenset((s, t)) not in together:
                return s, t
    return None




class SlotMap:
    """The arena's live buffers for the verifier: disjoint [low, high) ranges sorted by
    offset, each with the tensors it holds (two while an output takes an input's slot in
    place)."""

    def __init__(self) -> None:
        self.lows: list[int] = []
        self.rows: list[tuple[int, int, set[int]]] = []
        self.where: dict[int, int] = {}  # tensor -> low of its row

    def overlapping(self, low: int, high: int) -> list[tuple[int, int, set[int]]]:
        """Live rows that meet [low, high)."""
        out = []
        j = bisect.bisect_left(self.lows, high) - 1
        while j >= 0 and self.rows[j][1] > low:
            out.append(self.rows[j])
            j -= 1
        return out

    def add(self, low: int, high: int, tid: int) -> None:
        j = bisect.bisect_left(self.lows, low)
        if j < len(self.rows) and self.rows[j][0] == low and self.rows[j][1] == high:
            self.rows[j][2].add(tid)
        else:
            self.lows.insert(j, low)
            self.rows.insert(j, (low, high, {tid}))
        self.where[tid] = low

    def remove(self, tid: int) -> None:
        low = self.where.pop(tid, None)
        if low is None:
            return
        j = bisect.bisect_left(self.lows, low)
        while self.rows[j][0] == low and tid not in self.rows[j][2]:
            j += 1
        self.rows[j][2].discard(tid)
        if not self.rows[j][2]:
            del self.lows[j], self.rows[j]
