"""`Executor`: a plan's records run for real with torch, one iteration per `run()`.

GPU (``device="cuda"``): compute runs on the current (default) stream; host->device and
device->host copies run on two dedicated copy streams, ordered with events, so they overlap with
compute and with each other. The slow tier is one pinned host pool, allocated once and reused
across iterations (a `cudaHostAlloc` per tensor would cost milliseconds each). Every tensor is
allocated and freed on the compute stream, and freed only after the compute stream has waited for
any copy that touches it, so the caching allocator reuses memory in stream order and its peak is
at most the plan's (`record_stream` would hold blocks until the host sees the copy end).

CPU (``device="cpu"``): the same records with real copies between two host dictionaries; this
checks a plan's correctness (results are bitwise equal between plans, since moves are copies).

Where the fast copies live and how kernels write them is the executor's memory strategy
(`runtime.memory`: torch's caching allocator, or an arena at planned addresses); how
iterations are driven (eagerly, or captured once as a CUDA graph and replayed) is its driver
(`runtime.drivers`); `runtime.execute.compose` puts the three together.

Semantics follow `autotm_py.plan`: an async move issued before ``Compute(k)`` starts when
kernel k starts (the copy stream waits for the work enqueued before k), and the compute stream
waits for it where its tensor is next used: a prefetch where the tensor is read, written out or
freed, a write where its source is freed or written over; so a copy may run on beside the
kernels after k (docs/planning.md, "Copies join at their use"). A sync move is ordered on the
compute stream.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from autotm_py.errors import ExecutionError
from autotm_py.interpreter import PlanInterpreter
from autotm_py.ir.rerun import rerun_kernel
from autotm_py.kernels.util import empty_like_tensor, in_layout
from autotm_py.memory.tiers import FAST, SLOW
from autotm_py.plan import INITIAL, Compute, Fill, Free, Move, Plan, Recompute
from autotm_py.runtime.memory import CachingMemory, overlaps, same_place
from autotm_py.runtime.pinned import HostUploads, PinnedPool, slow_tier_layout

if TYPE_CHECKING:
    from autotm_py.ir.graph import Kernel, TensorGraph

# Async copies join where their tensors are next used (a read's destination where it is read,
# a write's source where it is freed or written over), not at the end of the kernel they
# overlap; False restores AutoTM's step join (experiments/gpu/prefetch_join_check.py measures
# both on one plan; the simulator predicts the default).
JOIN_COPIES_AT_USE = True

KERNEL_RANGE = "autotm-kernel-"  # profiler range around kernel k: KERNEL_RANGE + str(k)


@dataclass
class _Streams:
    h2d: Any
    d2h: Any


# The copy streams and the capture stream of every executor on a device: one set per process.
# cuBLAS gives each stream it runs on a workspace that lives as long as the process, so new
# streams per executor made every capped run of a sweep (`bench --execute`, arena_check.py,
# the GPU tests) start with the workspaces of the runs before it allocated under its cap
# (tests/test_arena_gpu.py counts them).
_SIDE_STREAMS: dict[torch.device, tuple[Any, Any, Any]] = {}


def side_streams(device: torch.device) -> tuple[Any, Any, Any]:
    """(host-to-device, device-to-host, capture) streams of `device`, made once."""
    if device.index is None:
        device = torch.device(device.type, torch.cuda.current_device())
    if device not in _SIDE_STREAMS:
        _SIDE_STREAMS[device] = (torch.cuda.Stream(device), torch.cuda.Stream(device),
                                 torch.cuda.Stream(device))
    return _SIDE_STREAMS[device]


@dataclass
class State:
    """One iteration's tensors, copies in flight and counters."""

    fast: dict[int, torch.Tensor] = field(default_factory=dict)
    slow: dict[int, torch.Tensor] = field(default_factory=dict)
    pending: dict[tuple[int, str], Any] = field(default_factory=dict)  # copy events
    attached: dict[int, list[Any]] = field(default_factory=dict)  # kernel -> its async copies
    streams: set[str] = field(default_factory=set)  # copy streams this iteration used
    copied: int = 0  # outputs copied into their slots
    placed: int = 0  # outputs a kernel allocated at their slots (the placed allocator)
    # fast tensors whose storage another tensor shares (views, Identity): never written over
    shared: set[int] = field(default_factory=set)
    overwritten: int = 0  # outputs written over an input that died at their kernel
    updated: set[int] = field(default_factory=set)  # SGD updates run ahead, in a foreach
    joined: set[Any] = field(default_factory=set)  # copy events the compute stream waited for
    # slots freed while a copy to the slow tier still reads them: (the freed view, the copy's
    # event); whoever writes the slot next waits for the copy (`claim`)
    busy: list[tuple[torch.Tensor, Any]] = field(default_factory=list)
    # work put on the compute stream so far (kernels, copies, waits), and its count when each
    # copy stream last waited for the compute stream
    enqueued: int = 0
    forked: dict[str, int] = field(default_factory=dict)


class Executor(PlanInterpreter):
    """Executes one iteration per `run()` under a memory strategy (`memory`, default torch's
    caching allocator); `masters` holds the initial value of every tensor without a producer
    (host copies), and the carried values go from one iteration to the next."""

    def __init__(self, graph: TensorGraph, plan: Plan, *, device: str,
                 masters: Mapping[int, torch.Tensor], memory: CachingMemory | None = None,
                 kernel_times: bool = False, kernel_ranges: bool = False) -> None:
        super().__init__(graph, plan)
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.masters = masters
        self.memory = memory or CachingMemory(graph, plan, self.device)
        self.kernel_times = kernel_times
        # each kernel inside a profiler range named KERNEL_RANGE + id (device-time profiling)
        self.kernel_ranges = kernel_ranges
        self.state = State()
        self.carry: dict[int, tuple[str, torch.Tensor]] = {}
        self._carried = frozenset(first for first, _ in graph.carried)
        self.streams = _Streams(*side_streams(self.device)[:2]) if self.cuda else None
        offsets, nbytes = slow_tier_layout(graph, plan)
        self.pool = PinnedPool(offsets, nbytes, pin=self.cuda)
        self.uploads = HostUploads() if self.cuda else None
        self._kernel_events: list[Any] = []
        self._compute: Any = None  # the iteration's compute stream (CUDA; `start`)
        self._prepared = False
        # copies of these tensors are reported to `copy_hook(tid, to, event)` as they are
        # enqueued, with an event that completes with the copy (None on the CPU, where it has
        # completed): the host's optimizer updates wait on them (`trainer.host`)
        self.hooked: frozenset[int] = frozenset()
        self.copy_hook: Callable[[int, str, Any], None] | None = None
        # the events recorded in a CUDA-graph capture, until the driver takes them to keep as
        # long as the graph: its event record nodes use them, and one destroyed (a hook keeps
        # only a tensor's last copy's) made capture_end crash (the H100, 2026-12-05: fp32
        # weights read twice)
        self._captured_events: list[Any] = []

    def take_captured_events(self) -> list[Any]:
        """The events recorded since the last call, for the caller to keep alive as long as
        the CUDA graph that captured them."""
        events, self._captured_events = self._captured_events, []
        return events

    # ---- iteration boundaries ------------------------------------------------------------
    def prepare(self) -> None:
        """Place every given tensor where the plan starts it (untimed, like a data loader)."""
        self.state = State()
        self._kernel_events = []
        self.index = INITIAL
        for tid, tiers in self.plan.initial.items():
            self._place_initial(tid, tiers)
        # Drop the previous iteration's references: a carried copy in a tier where the next
        # iteration does not start it would otherwise stay allocated through that iteration.
        self.carry = {}
        self._prepared = True

    def prepare_replay(self) -> None:
        """`prepare` before a CUDA graph's replay: places only the tensors that are not
        carried (the batch, the learning rate, constants whose slots the arena reuses). The
        carried values already sit in the slots the graph reads (`_steady` copied them there in
        the captured iteration); placing them again cost ResNet-200's Trainer a slot view per
        weight, momentum and copy, about 2,000 a step, while the GPU idled."""
        self.state = State()  # the capture's events are not this step's
        self.index = INITIAL  # `fast_slot` looks slots up at the current record
        for tid, tiers in self.plan.initial.items():
            if tid not in self.carry:
                self._place_initial(tid, tiers)
        self._prepared = True

    def start(self) -> None:
        if not self._prepared:
            self.prepare()
        self._prepared = False
        # The compute stream of this iteration (the capture's, while capturing), looked up
        # once: `torch.cuda.current_stream` costs several microseconds of host time, and an
        # eager plan with moves needs it at every copy, join and wait (thousands per iteration).
        self._compute = torch.cuda.current_stream(self.device) if self.cuda else None
        if self.kernel_times and self.cuda:
            first = torch.cuda.Event(enable_timing=True)
            first.record()
            self._kernel_events = [first]

    def _place_initial(self, tid: int, tiers: tuple[str, ...]) -> None:
        carried = self.carry.get(tid)
        for tier in tiers:
            if carried is not None and carried[0] == tier and self._in_place(tid, tier,
                                                                            carried[1]):
                self._store(tier)[tid] = carried[1]
            else:
                source = carried[1] if carried is not None else self.masters[tid]
                # a carried tensor's master is uploaded once: later steps start from the carry
                once = carried is None and tid in self._carried
                self._store(tier)[tid] = self._materialize(tid, source, tier, once)

    def _in_place(self, tid: int, tier: str, value: torch.Tensor) -> bool:
        """Whether a carried value already sits where the plan starts `tid` in `tier` (always,
        without slots; with them, the steady slot the verifier checks)."""
        slot = self.fast_slot(tid) if tier == FAST else None
        return slot is None or slot.data_ptr() == value.data_ptr()

    def fast_slot(self, tid: int, stream: Any = None) -> torch.Tensor | None:
        """The slot of the fast copy of `tid` that the current record makes (the memory's
        fixed addresses), None where torch allocates it. Whoever writes it (the compute
        stream, or `stream`) first waits for the copies out of earlier tenants that may still
        read it (`free`)."""
        slots = self.memory.slots
        if slots is None:
            return None
        view = slots.view(self.index, self.graph.tensors[tid])
        if view is not None and self.state.busy:
            self.claim(view, stream)
        return view

    def claim(self, view: torch.Tensor, stream: Any) -> None:
        """Order the writer of `view` after every copy out of a freed tenant it overlaps."""
        for old, event in self.state.busy:
            if event in self.state.joined or not overlaps(view, old):
                continue
            if stream is None or stream is self._compute:
                self._join(event)
            else:
                stream.wait_event(event)
        self.state.busy = [(v, e) for v, e in self.state.busy if e not in self.state.joined]

    def _materialize(self, tid: int, source: torch.Tensor, tier: str, once: bool = False
                     ) -> torch.Tensor:
        dst = self.pool.view(tid, self.graph.tensors[tid]) if tier == SLOW else \
            self.fast_slot(tid)
        if self.uploads is not None and tier == FAST and source.device.type == "cpu":
            dst = torch.empty_like(source, device=self.device) if dst is None else dst
            self.uploads.copy(tid, source, dst, once)
            return dst
        if dst is None:
            return source.to(self.device, copy=True)
        dst.copy_(source)
        return dst

    def finish(self) -> None:
        """Join the copy streams this iteration used (a CUDA graph must not wait for a stream
        outside its capture), then hand each carried value to the next iteration."""
        if self.streams is not None:
            for name in sorted(self.state.streams):
                self._compute.wait_stream(getattr(self.streams, name))
        self.carry = {}
        for first, last in self.graph.carried:
            self.carry[first] = self._steady(first, *self._final_copy(first, last))

    def _steady(self, first: int, tier: str, value: torch.Tensor) -> tuple[str, torch.Tensor]:
        """A carried value that ends outside the slot where the next iteration starts it is
        copied there now, in the iteration (timed, and captured in a CUDA graph). Arena: both
        copies were live at once (`arena.Lifetimes.boundary`), and the packing kept that slot
        free; static inputs: the value was allocated during the iteration."""
        slots = self.memory.slots
        slot = slots.view(INITIAL, self.graph.tensors[first]) \
            if tier == FAST and slots is not None else None
        if slot is None or slot.data_ptr() == value.data_ptr():
            return tier, value
        return tier, self._in_slot(value, slot)

    def _final_copy(self, first: int, last: int) -> tuple[str, torch.Tensor]:
        """The copy of `last` in the tier where `first` starts the next iteration (a plan
        ends carried tensors there), else any copy."""
        for tier in (*self.plan.initial.get(first, ()), FAST, SLOW):
            if last in self._store(tier):
                return tier, self._store(tier)[last]
        raise ExecutionError(f"carried tensor {self.graph.name_of(last)!r} is in no tier at "
                             "the end of the iteration; the plan freed it")

    # ---- records ---------------------------------------------------------------------------
    def compute(self, record: Compute) -> None:
        if self.memory.placed is None:  # no window to open: no context manager on the hot path
            self._run_compute(record)
            return
        with self.memory.scratch(self, record.kernel):
            self._run_compute(record)

    def _run_compute(self, record: Compute) -> None:
        self.state.enqueued += 1
        kernel = self.graph.kernels[record.kernel]
        n_in = len(kernel.inputs)
        args = self._args(kernel, record.placement)
        out_tiers = record.placement[n_in:]
        slots = None if self.memory.slots is None else [
            self.fast_slot(tid) if tier == FAST else None
            for tid, tier in zip(kernel.outputs, out_tiers, strict=True)]
        if self.kernel_ranges:
            with torch.profiler.record_function(f"{KERNEL_RANGE}{record.kernel}"):
                outputs = self.memory.launch(self, kernel, args, slots)
        else:
            outputs = self.memory.launch(self, kernel, args, slots)
        if self.state.attached:
            for event in self.state.attached.pop(record.kernel, ()):
                # AutoTM's join: the writes overlapped with this kernel finish with it, as the
                # planner and the simulator assume (a step lasts max(kernel, its writes)).
                self._join(event)
        if slots is None and SLOW not in out_tiers:  # (an arena gives slots)
            self.state.fast.update(zip(kernel.outputs, outputs, strict=True))
        else:
            self._store_outputs(kernel, out_tiers, outputs, slots)
        if self.kernel_times and self.cuda:
            # One event after each kernel: a kernel's time is the interval since the previous
            # event, i.e. what it adds to the iteration (dispatch gaps included), so the
            # kernel times sum to the iteration's time.
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._kernel_events.append(end)

    def _args(self, kernel: Kernel, placement: tuple[str, ...]) -> list[torch.Tensor]:
        """The kernel's inputs from the tiers the record names (after their copies land).
        Kept to one lookup per input where no copy is in flight and every input is fast: this
        runs for every kernel of an eager iteration, whose host time it is."""
        if not self.state.pending and SLOW not in placement[:len(kernel.inputs)]:
            fast = self.state.fast
            try:
                return [fast[tid] for tid in kernel.inputs]
            except KeyError:
                pass  # `read` raises the error that names the missing tensor
        return [self.read(tid, placement[i]) for i, tid in enumerate(kernel.inputs)]

    def _store_outputs(self, kernel: Kernel, tiers: tuple[str, ...],
                       outputs: list[torch.Tensor],
                       slots: list[torch.Tensor | None] | None) -> None:
        """Keep each output where the plan puts it; in its slot, copied there unless the
        kernel wrote it there (after the join: an output that takes its input's slot in
        place may be written only once the copies reading that input have finished)."""
        for j, (tid, tier, value) in enumerate(zip(kernel.outputs, tiers, outputs, strict=True)):
            slot = None if slots is None else slots[j]
            if slot is not None:
                value = self._in_slot(value, slot)
            elif self.memory.arena is not None:
                value = in_layout(value, self.graph.tensors[tid])
            if tier == SLOW and self.cuda:
                raise ExecutionError(f"kernel {kernel.name!r} writes {self.graph.name_of(tid)!r} "
                                     "to the slow tier; on a GPU every output is in fast memory")
            self._store(tier)[tid] = value

    def _in_slot(self, value: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
        """An output in its slot: copied there unless the kernel wrote it in place or
        allocated it there (the placed allocator)."""
        if value is slot:
            return slot
        if same_place(value, slot):
            self.state.placed += 1
        else:
            slot.copy_(value)
            self.state.copied += 1
        return slot

    def recompute(self, record: Recompute) -> None:
        """Re-run a forward kernel on the compute stream, before the next kernel, and keep the
        outputs the record names in fast memory (the others are dropped at once). The kernels
        are deterministic, so the regenerated values equal the first ones bit for bit (on CUDA
        with deterministic algorithms)."""
        if self.memory.placed is None:
            self._run_recompute(record)
            return
        with self.memory.scratch(self, record.kernel):
            self._run_recompute(record)

    def _run_recompute(self, record: Recompute) -> None:
        self.state.enqueued += 1
        kernel = rerun_kernel(self.graph.kernels[record.kernel])
        args = [self.read(tid, FAST) for tid in kernel.inputs]
        # at fixed addresses, the kept outputs go to the slots this record gives them; the
        # dropped ones are the re-run's scratch, as the packing counts them
        slots = [self.fast_slot(tid) if tid in record.outputs else None
                 for tid in kernel.outputs]
        outputs = self.memory.run(self, kernel, args, slots)
        for tid, value, slot in zip(kernel.outputs, outputs, slots, strict=True):
            if tid not in record.outputs:
                continue
            if tid in self.state.fast:
                raise ExecutionError(f"recompute of {self.graph.name_of(tid)!r}: it is already "
                                     "in the fast tier")
            self.state.fast[tid] = value if slot is None else self._in_slot(value, slot)

    def fill(self, record: Fill) -> None:
        """Make the fast copy of a known-value tensor with a fill kernel on the compute stream
        (in its slot at fixed addresses), instead of copying it from the slow tier."""
        tid = record.tensor
        if tid in self.state.fast:
            raise ExecutionError(f"fill of {self.graph.name_of(tid)!r}: it is already in the "
                                 "fast tier")
        self.state.enqueued += 1
        slot = self.fast_slot(tid)
        value = slot if slot is not None else empty_like_tensor(self.graph.tensors[tid],
                                                                 self.device)
        self.state.fast[tid] = value.fill_(record.value)

    def wait_for_copy_out(self, tid: int) -> None:
        """Before `tid`'s fast copy is written over: the copy to the slow tier reading it ends."""
        event = self.state.pending.get((tid, SLOW))
        if event is not None:
            self._join(event)

    def _join(self, event: Any) -> None:
        """The compute stream waits for a copy's event, once: a later wait for the same event
        (a free after the join of the kernel the copy overlapped) orders nothing more, and each
        costs host time."""
        if event not in self.state.joined:
            self._compute.wait_event(event)
            self.state.joined.add(event)
            self.state.enqueued += 1

    def read(self, tid: int, tier: str) -> torch.Tensor:
        """The copy of `tid` in `tier`, once any copy making it has landed."""
        store = self._store(tier)
        if tid not in store:
            raise ExecutionError(f"tensor {self.graph.name_of(tid)!r} is not in the {tier} tier")
        event = self.state.pending.pop((tid, tier), None)
        if event is not None:
            self._join(event)
        return store[tid]

    def move(self, record: Move) -> None:
        tid, to = record.tensor, record.to
        frm = SLOW if to == FAST else FAST
        source_store = self._store(frm)
        if tid not in source_store:
            raise ExecutionError(f"tensor {self.graph.name_of(tid)!r} is not in the {frm} tier")
        src = source_store[tid]
        if not self.cuda:
            self._store(to)[tid] = self._materialize(tid, src, to)
            if tid in self.hooked:
                self._report_copy(tid, to, None)
            return
        self._store(to)[tid] = self._copy_cuda(tid, src, to, record.mode == "async")
        if tid in self.hooked:
            stream = getattr(self.streams, "h2d" if to == FAST else "d2h") \
                if record.mode == "async" else self._compute
            # external: a CUDA graph's replays record it again, for the host to wait on
            capturing = torch.cuda.is_current_stream_capturing()
            event = torch.cuda.Event(external=capturing)
            event.record(stream)
            if capturing:
                self._captured_events.append(event)
            self._report_copy(tid, to, event)
        if record.mode == "async" and record.overlaps is not None and not JOIN_COPIES_AT_USE:
            # AutoTM's join at the end of the kernel it overlaps. Otherwise a copy is joined
            # where its tensor is next used: a prefetch where it is read (`read`), written out
            # or freed, a write where its source is freed (`free`) or written over
            # (`wait_for_copy_out`), a later read of the slow copy on its own stream
            # (`_copy_cuda`'s source event); so it overlaps every kernel until then.
            self.state.attached.setdefault(record.overlaps, []).append(
                self.state.pending[(tid, to)])

    def _report_copy(self, tid: int, to: str, event: Any) -> None:
        if self.copy_hook is not None:
            self.copy_hook(tid, to, event)

    def _copy_cuda(self, tid: int, src: torch.Tensor, to: str, asynchronous: bool) -> torch.Tensor:
        assert self.streams is not None
        current = self._compute
        name = "h2d" if to == FAST else "d2h"
        stream = getattr(self.streams, name) if asynchronous else current
        dst = self.pool.view(tid, self.graph.tensors[tid]) if to == SLOW else \
            self.fast_slot(tid, stream)
        if dst is None:
            dst = torch.empty_like(src, device=self.device)
        source_event = self.state.pending.get((tid, SLOW if to == FAST else FAST))
        if stream is not current:
            self.state.streams.add(name)
            # Start when the kernel it overlaps starts: after everything enqueued so far, which
            # also protects freshly allocated memory that earlier kernels (or copies the compute
            # stream joined) may still be using. Once per copy stream and kernel: if the compute
            # stream got no work since this stream last waited for it (several copies overlap
            # one kernel), that wait already orders this copy, and each costs an event.
            if self.state.forked.get(name) != self.state.enqueued:
                stream.wait_stream(current)
                self.state.forked[name] = self.state.enqueued
        if source_event is not None:
            stream.wait_event(source_event)
        if stream is current:
            dst.copy_(src, non_blocking=True)
            self.state.enqueued += 1
            return dst
        return self._copy_on(stream, tid, to, src, dst)

    def _copy_on(self, stream: Any, tid: int, to: str, src: torch.Tensor,
                 dst: torch.Tensor) -> torch.Tensor:
        """The copy enqueued on a copy stream (set directly: the `torch.cuda.stream` context
        costs more host time than the copy's own launch), with the event its reader joins."""
        torch.cuda.set_stream(stream)
        try:
            dst.copy_(src, non_blocking=True)
        finally:
            torch.cuda.set_stream(self._compute)
        event = torch.cuda.Event()
        event.record(stream)
        self.state.pending[(tid, to)] = event
        return dst

    def free(self, record: Free) -> None:
        tid, tier = record.tensor, record.tier
        store = self._store(tier)
        if self.state.pending:
            if self.cuda and tier == FAST:
                self._settle_copies(tid, store)
            self.state.pending.pop((tid, tier), None)
        try:
            del store[tid]
        except KeyError:
            raise ExecutionError(f"free of {self.graph.name_of(tid)!r}: not in the {tier} "
                                 "tier") from None

    def _settle_copies(self, tid: int, store: dict[int, torch.Tensor]) -> None:
        """Before the compute stream frees `tid`'s fast copy, a copy still reading (to slow)
        or writing (to fast) that memory must be done: the caching allocator may hand the
        block to the next allocation on this stream at once (without `record_stream` the
        memory is released in stream order, so the allocator's peak is the plan's). At
        planned addresses the slot's next tenant is known: it waits instead (`claim`)."""
        pending = self.state.pending
        for key in ((tid, SLOW), (tid, FAST)):
            event = pending.get(key)
            if event is None:
                continue
            if key[1] == SLOW and self.memory.defers_reuse and JOIN_COPIES_AT_USE \
                    and tid in store:
                self.state.busy.append((store[tid], event))
            else:
                self._join(event)

    def _store(self, tier: str) -> dict[int, torch.Tensor]:
        return self.state.fast if tier == FAST else self.state.slow

    # ---- results ---------------------------------------------------------------------------
    def where(self) -> str:
        """The record the executor is at, in words (for errors)."""
        if 0 <= self.index < len(self.plan.records):
            return self.describe(self.plan.records[self.index])
        return "the start of the iteration" if self.index < 0 else "its end"

    def kernel_seconds(self) -> list[float]:
        events = self._kernel_events
        return [a.elapsed_time(b) / 1e3 for a, b in itertools.pairwise(events)]

    def value(self, tid: int) -> torch.Tensor:
        """The final value of a tensor still held after `run()` (fast copy first)."""
        if self.cuda:
            # A slow copy is pinned host memory that a copy stream (or a replayed CUDA graph,
            # which returns at once) may still be writing: read it only once the GPU is done.
            torch.cuda.synchronize(self.device)
        for store in (self.state.fast, self.state.slow):
            if tid in store:
                return store[tid]
        raise ExecutionError(f"tensor {self.graph.name_of(tid)!r} is not held after the run")

    def release(self) -> None:
        """Drop every device tensor the executor holds (after a failed run, `runtime.execute`
        also collects and empties the allocator's cache)."""
        self.state, self.carry = State(), {}
        self.memory.fence(False)
        self.memory.release()
