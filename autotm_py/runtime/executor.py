"""`Executor`: runs a plan for real with torch and measures it.

GPU (``device="cuda"``): compute runs on the current (default) stream; host->device and
device->host copies run on two dedicated copy streams, ordered with events, so they overlap with
compute and with each other. The slow tier is one pinned host pool, allocated once and reused
across iterations (a `cudaHostAlloc` per tensor would cost milliseconds each). Every tensor is
allocated and freed on the compute stream, and freed only after the compute stream has waited for
any copy that touches it, so the caching allocator reuses memory in stream order and its peak is
at most the plan's (`record_stream` would hold blocks until the host sees the copy end). An
elementwise kernel writes its output over an input that dies at it (`runtime.reuse`), as
autograd's in-place accumulation does. The budget is enforced with
`torch.cuda.set_per_process_memory_fraction`, and the measured peak (`max_memory_allocated`) is
reported beside the modelled one.

CPU (``device="cpu"``): the same records with real copies between two host dictionaries; this
checks a plan's correctness (results are bitwise equal between plans, since moves are copies).

Arena (``arena=True``, a plan with `Plan.arena`): every fast copy is a view of one arena at its
planned offset (`runtime.arena.DeviceArena`, on the GPU and the CPU alike). Kernels that can
write their outputs in place (`kernels.into`) write into the slots; the others' outputs are
copied into them after the kernel and its overlapped copies (which an output taking its input's
slot in place needs). `graph=True` (CUDA) captures one steady-state iteration as a CUDA graph
after the warm-up and replays it (`runtime.arena.GraphReplay`).

Semantics follow `autotm_py.plan`: an async move issued before ``Compute(k)`` starts when
kernel k starts (the copy stream waits for the work enqueued before k), and the compute stream
waits for it where its tensor is next used: a prefetch where the tensor is read, written out or
freed, a write where its source is freed or written over; so a copy may run on beside the
kernels after k (docs/planning.md, "Copies join at their use"). A sync move is ordered on the
compute stream.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import logging
import re
import statistics
import traceback
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from autotm_py.errors import ConfigError, ExecutionError
from autotm_py.interpreter import PlanInterpreter
from autotm_py.kernels import run_kernel, run_kernel_into, run_kernel_raw
from autotm_py.kernels.util import in_layout, memory_format
from autotm_py.memory.scratch import OVERWRITES
from autotm_py.memory.tiers import FAST, SLOW
from autotm_py.plan import INITIAL, Compute, Free, Move, Plan, Recompute
from autotm_py.runtime import placed
from autotm_py.runtime.arena import DeviceArena, GraphReplay, StaticInputs, overlaps
from autotm_py.runtime.device import (
    DEFAULT_ALLOCATOR_SETTINGS,
    apply_cap,
    check_device,
    configure_cuda,
    device_name,
    eager_work_queues_note,
    peaks,
    prime_blas_workspaces,
    release_blas_workspaces,
    release_cap,
    replay_work_queues_note,
    reset_peaks,
    set_cap,
    time_region,
)
from autotm_py.runtime.pinned import PinnedPool, slow_tier_layout
from autotm_py.runtime.reuse import overwritable_inputs, update_runs

if TYPE_CHECKING:
    from autotm_py.ir.graph import TensorGraph

log = logging.getLogger(__name__)
# Async copies join where their tensors are next used (a read's destination where it is read,
# a write's source where it is freed or written over), not at the end of the kernel they
# overlap; False restores AutoTM's step join (experiments/gpu/prefetch_join_check.py measures
# both on one plan; the simulator predicts the default).
JOIN_COPIES_AT_USE = True

# The cap is the budget and this much for library workspaces (cuBLAS, cuDNN handles).
CAP_SLACK_BYTES = 64 << 20

KERNEL_RANGE = "autotm-kernel-"  # profiler range around kernel k: KERNEL_RANGE + str(k)


@dataclass(frozen=True)
class RunResult:
    """What one `execute` measured. Times in seconds, memory in bytes."""

    device: str
    device_name: str
    iterations: int
    warmup: int
    iteration_times_s: tuple[float, ...]
    median_s: float
    kernel_times_s: tuple[float, ...] | None
    peak_fast_bytes: int | None
    modelled_peak_fast_bytes: int | None
    budget_bytes: int | None
    cap_bytes: int | None
    predicted_time_s: float | None
    slow_pool_bytes: int
    strategy: str
    model_name: str
    notes: tuple[str, ...] = ()
    # every timed iteration's kernel times, when asked for (in-context profiling)
    kernel_samples_s: tuple[tuple[float, ...], ...] | None = None
    # Diagnostics of a slow run. host_median_s: how long the host took to enqueue one
    # iteration; near median_s, the GPU waited for Python dispatch. alloc_retries: times the
    # caching allocator hit the cap, released its cache and retried (each synchronizes the GPU).
    host_median_s: float | None = None
    alloc_retries: int | None = None
    # CUDA: the most memory torch's allocator held (reserved: allocated blocks and the cache),
    # beside `peak_fast_bytes` (allocated). With an arena, the arena's bytes; `copied_outputs`:
    # outputs per iteration copied into their slots (the rest were written in place). `graph`:
    # the timed iterations were CUDA-graph replays; `capture_reserved_bytes`: the most the
    # allocator held while capturing it (once, before the timed replays: `CAPTURE_ALLOWANCE`).
    reserved_peak_bytes: int | None = None
    arena_bytes: int | None = None
    copied_outputs: int | None = None
    graph: bool = False
    capture_reserved_bytes: int | None = None
    # outputs per iteration that kernels allocated at their slots (the placed allocator,
    # `runtime.placed`); None where it was not installed
    placed_outputs: int | None = None
    # CUDA, when asked (`device_busy`): one more iteration after the timed ones, profiled
    # (`runtime.device_trace`): how long the GPU worked in it (any kernel, copy or memset on
    # any stream), its span, and its kernels' summed device time. median_s / device_busy_s
    # near 1: the GPU never waited for the host.
    device_busy_s: float | None = None
    device_span_s: float | None = None
    device_kernel_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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


def _side_streams(device: torch.device) -> tuple[Any, Any, Any]:
    """(host-to-device, device-to-host, capture) streams of `device`, made once."""
    if device.index is None:
        device = torch.device(device.type, torch.cuda.current_device())
    if device not in _SIDE_STREAMS:
        _SIDE_STREAMS[device] = (torch.cuda.Stream(device), torch.cuda.Stream(device),
                                 torch.cuda.Stream(device))
    return _SIDE_STREAMS[device]


@dataclass
class _State:
    fast: dict[int, torch.Tensor] = field(default_factory=dict)
    slow: dict[int, torch.Tensor] = field(default_factory=dict)
    pending: dict[tuple[int, str], Any] = field(default_factory=dict)  # copy events
    attached: dict[int, list[Any]] = field(default_factory=dict)  # kernel -> its async copies
    streams: set[str] = field(default_factory=set)  # copy streams this iteration used
    copied: int = 0  # outputs copied into their arena slots
    placed: int = 0  # outputs a kernel allocated at their slots (the placed allocator)
    # fast tensors whose storage another tensor shares (views, Identity): never written over
    shared: set[int] = field(default_factory=set)
    overwritten: int = 0  # outputs written over an input that died at their kernel
    updated: set[int] = field(default_factory=set)  # SGD updates run ahead, in a foreach
    joined: set[Any] = field(default_factory=set)  # copy events the compute stream waited for
    # arena slots freed while a copy to the slow tier still reads them: (the freed view, the
    # copy's event); whoever writes the slot next waits for the copy (`_claim`)
    busy: list[tuple[torch.Tensor, Any]] = field(default_factory=list)
    # work put on the compute stream so far (kernels, copies, waits), and its count when each
    # copy stream last waited for the compute stream
    enqueued: int = 0
    forked: dict[str, int] = field(default_factory=dict)


class Executor(PlanInterpreter):
    """Executes one iteration per `run()`; `values` carries weights between iterations."""

    def __init__(self, graph: TensorGraph, plan: Plan, *, device: str,
                 masters: Mapping[int, torch.Tensor], kernel_times: bool = False,
                 kernel_ranges: bool = False, arena: bool = False,
                 static_inputs: bool = False) -> None:
        super().__init__(graph, plan)
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.masters = masters  # host copies of every no-producer tensor (initial values)
        self.kernel_times = kernel_times
        # each kernel inside a profiler range named KERNEL_RANGE + id (device-time profiling)
        self.kernel_ranges = kernel_ranges
        self.state = _State()
        self.carry: dict[int, tuple[str, torch.Tensor]] = {}
        self.streams = _Streams(*_side_streams(self.device)[:2]) if self.cuda else None
        offsets, nbytes = slow_tier_layout(graph, plan)
        self.pool = PinnedPool(offsets, nbytes, pin=self.cuda)
        self._kernel_events: list[Any] = []
        if arena and plan.arena is None:
            raise ConfigError("the plan has no arena: plan with `autotm optimize --arena`, or "
                              "pack it first (`api.with_arena`)")
        if self.cuda and arena:
            prime_blas_workspaces(self.device)
        self.arena = DeviceArena(plan.arena, self.device) if arena and plan.arena else None
        # outputs of kernels without an `out=` form allocated at their slots, where the placed
        # allocator is torch's (`runtime.placed`); else they are copied there
        self._placed = placed.active() if self.arena is not None else None
        if self._placed is not None:
            self._placed.set_arena(self.arena.buffer.data_ptr(), self.arena.nbytes)
        # kernels that asked for more scratch than their window holds: name -> (largest
        # request served from outside it, the window's bytes), over every iteration
        self.spills: dict[str, tuple[int, int]] = {}
        # without an arena, outputs written over inputs that die at their kernel (`reuse`)
        self._overwritable = {} if self.arena is not None else overwritable_inputs(graph, plan)
        # runs of SGD updates done as one foreach (not while kernels are timed one by one)
        self._updates = {} if kernel_times or kernel_ranges else \
            update_runs(graph, plan, self._overwritable)
        # where fast copies live at fixed addresses: every one (the arena), or only those the
        # iteration starts with (`static_inputs`, for a CUDA graph without an arena), or none
        self.slots: DeviceArena | StaticInputs | None = self.arena or (
            StaticInputs(self.device) if static_inputs else None)
        # the captured iteration (`capture`), and the stream it is captured on
        self._graph: GraphReplay | None = None
        self.capture_stream = _side_streams(self.device)[2] if self.cuda else None
        self._compute: Any = None  # the iteration's compute stream (CUDA; `start`)
        self._end: tuple[_State, dict[int, tuple[str, torch.Tensor]]] | None = None

    # ---- iteration boundaries ------------------------------------------------------------
    def prepare(self) -> None:
        """Place every given tensor where the plan starts it (untimed, like a data loader)."""
        self.state = _State()
        self._kernel_events = []
        self.index = INITIAL
        for tid, tiers in self.plan.initial.items():
            self._place_initial(tid, tiers)
        # Drop the previous iteration's references: a carried copy in a tier where the next
        # iteration does not start it would otherwise stay allocated through that iteration.
        self.carry = {}
        self._prepared = True

    def start(self) -> None:
        if not getattr(self, "_prepared", False):
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
                self._store(tier)[tid] = self._materialize(tid, source, tier)

    def _in_place(self, tid: int, tier: str, value: torch.Tensor) -> bool:
        """Whether a carried value already sits where the plan starts `tid` in `tier` (always,
        without an arena; with one, the steady slot the verifier checks)."""
        slot = self._fast_slot(tid) if tier == FAST else None
        return slot is None or slot.data_ptr() == value.data_ptr()

    def _fast_slot(self, tid: int, stream: Any = None) -> torch.Tensor | None:
        """The slot of the fast copy of `tid` that the current record makes (arena, or static
        inputs at the start of the iteration), None where torch allocates it. Whoever writes
        it (the compute stream, or `stream`) first waits for the copies out of earlier tenants
        that may still read it (`free`)."""
        if self.slots is None:
            return None
        view = self.slots.view(self.index, self.graph.tensors[tid])
        if view is not None and self.state.busy:
            self._claim(view, stream)
        return view

    def _claim(self, view: torch.Tensor, stream: Any) -> None:
        """Order the writer of `view` after every copy out of a freed tenant it overlaps."""
        for old, event in self.state.busy:
            if event in self.state.joined or not overlaps(view, old):
                continue
            if stream is None or stream is self._compute:
                self._join(event)
            else:
                stream.wait_event(event)
        self.state.busy = [(v, e) for v, e in self.state.busy if e not in self.state.joined]

    def _materialize(self, tid: int, source: torch.Tensor, tier: str) -> torch.Tensor:
        dst = self.pool.view(tid, self.graph.tensors[tid]) if tier == SLOW else \
            self._fast_slot(tid)
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
        slot = self.slots.view(INITIAL, self.graph.tensors[first]) \
            if tier == FAST and self.slots is not None else None
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
        if self._placed is None:  # no window to open: no context manager on the hot path
            self._run_compute(record)
            return
        with self._scratch_window(record.kernel):
            self._run_compute(record)

    @contextlib.contextmanager
    def _scratch_window(self, kernel_id: int) -> Iterator[None]:
        """The current record's scratch window (a plan with `--scratch windows`): while the
        kernel runs, its workspaces and temporaries are allocated there (`runtime.placed`).
        What the kernel returns must be gone when it closes: the record's handler runs inside
        it and drops its locals first. No window (none planned, or no placed allocator): the
        kernel allocates beside the arena, as without windows. Either way the record is named
        to the placed allocator while it runs, for its report of requests beyond the cap."""
        assert self._placed is not None and self.arena is not None
        window = self.arena.window(self.index)
        if window is not None and self.state.busy:
            self._claim(window, None)  # freed tensors there may still be copied out
        self._placed.tag(self.index)
        try:
            if window is None:
                yield
                return
            with self._placed.window(window.data_ptr(), window.numel()) as use:
                yield
        except placed.WindowLeak as exc:
            name = self.graph.kernels[kernel_id].name
            raise ExecutionError(f"kernel {name!r}: {exc}; its window's bytes hold other "
                                 "tensors from now on (plan with --scratch region)") from None
        finally:
            self._placed.tag(-1)
        if use.largest_spill:
            name = self.graph.kernels[kernel_id].name
            largest = max(use.largest_spill, self.spills.get(name, (0, 0))[0])
            self.spills[name] = (largest, window.numel())

    def _run_compute(self, record: Compute) -> None:
        self.state.enqueued += 1
        kernel = self.graph.kernels[record.kernel]
        n_in = len(kernel.inputs)
        args = self._args(kernel, record.placement)
        out_tiers = record.placement[n_in:]
        slots = None if self.slots is None else [
            self._fast_slot(tid) if tier == FAST else None
            for tid, tier in zip(kernel.outputs, out_tiers, strict=True)]
        if self.kernel_ranges:
            with torch.profiler.record_function(f"{KERNEL_RANGE}{record.kernel}"):
                outputs = self._launch(kernel, args, slots)
        else:
            outputs = self._launch(kernel, args, slots)
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

    def _args(self, kernel: Any, placement: tuple[str, ...]) -> list[torch.Tensor]:
        """The kernel's inputs from the tiers the record names (after their copies land).
        Kept to one lookup per input where no copy is in flight and every input is fast: this
        runs for every kernel of an eager iteration, whose host time it is."""
        if not self.state.pending and SLOW not in placement[:len(kernel.inputs)]:
            fast = self.state.fast
            try:
                return [fast[tid] for tid in kernel.inputs]
            except KeyError:
                pass  # `_read` raises the error that names the missing tensor
        return [self._read(tid, placement[i]) for i, tid in enumerate(kernel.inputs)]

    def _store_outputs(self, kernel: Any, tiers: tuple[str, ...], outputs: list[torch.Tensor],
                       slots: list[torch.Tensor | None] | None) -> None:
        """Keep each output where the plan puts it; with an arena, copied into its slot unless
        the kernel wrote it there (after the join: an output that takes its input's slot in
        place may be written only once the copies reading that input have finished)."""
        for j, (tid, tier, value) in enumerate(zip(kernel.outputs, tiers, outputs, strict=True)):
            slot = None if slots is None else slots[j]
            if slot is not None:
                value = self._in_slot(value, slot)
            elif self.arena is not None:
                value = in_layout(value, self.graph.tensors[tid])
            if tier == SLOW and self.cuda:
                raise ExecutionError(f"kernel {kernel.name!r} writes {self.graph.name_of(tid)!r} "
                                     "to the slow tier; on a GPU every output is in fast memory")
            self._store(tier)[tid] = value

    def _launch(self, kernel: Any, args: list[torch.Tensor],
                slots: list[torch.Tensor | None] | None) -> list[torch.Tensor]:
        position = self._overwritable.get(self.index)
        if position is not None:
            if self.index in self._updates:
                self._run_updates(self._updates[self.index])
            if self.index in self.state.updated:
                return [args[position]]
            if self._may_overwrite(kernel.inputs[position], args[position]) and \
                    run_kernel_into(kernel, args, [args[position]]):
                self.state.overwritten += 1
                # the output owns the dead input's storage: no alias of it is live
                return [args[position]]
        outputs = self._run(kernel, args, slots)
        if self._overwritable:
            self._note_shared(kernel, args, outputs)
        return outputs

    def _may_overwrite(self, tid: int, arg: torch.Tensor) -> bool:
        """Whether a kernel may write its output over `arg`, its input `tid` that dies at it
        (`runtime.reuse`): only if `arg` owns its storage (no view or alias of it is live);
        a copy to the slow tier still reading it finishes first."""
        # every alias of a fast tensor comes from a kernel returning a view of (or the same
        # tensor as) its input, which `_note_shared` records: the other inputs are apart
        if tid in self.state.shared or arg._base is not None or \
                not arg.is_contiguous(memory_format=memory_format(self.graph.tensors[tid])):
            return False
        self._wait_for_copy_out(tid)
        return True

    def _run_updates(self, records: tuple[int, ...]) -> None:
        """Run a run of SGD updates (`reuse.update_runs`) as one foreach update over the
        weights it may write over, as torch.optim.SGD(foreach=True) does: the same
        `w + (-lr) * g` per element in one launch instead of one per weight (hundreds per
        iteration, each a few microseconds of host time). The others run at their records."""
        weights: list[torch.Tensor] = []
        grads: list[torch.Tensor] = []
        lr = 0.0
        for index in records:
            record = self.plan.records[index]
            kernel = self.graph.kernels[record.kernel]  # type: ignore[union-attr]
            w_id, g_id = kernel.inputs
            weight, grad = self._read(w_id, FAST), self._read(g_id, FAST)
            if self._may_overwrite(w_id, weight):
                weights.append(weight)
                grads.append(grad)
                lr = float(kernel.attr("lr"))
                self.state.updated.add(index)
        if weights:
            torch._foreach_add_(weights, grads, alpha=-lr)
            self.state.overwritten += len(weights)

    def _note_shared(self, kernel: Any, args: list[torch.Tensor],
                     outputs: list[torch.Tensor]) -> None:
        """Remember the tensors whose storage an output shares (a view of an input, or the
        input itself): none of them is ever written over. (A recompute re-runs a kernel that
        already ran this iteration, whose aliases are therefore recorded.)"""
        for out in outputs:
            shared = out._base is not None
            for arg in args:
                shared = shared or out is arg
            if shared:
                self.state.shared.update(kernel.inputs)
                self.state.shared.update(kernel.outputs)
                return

    def _in_slot(self, value: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
        """An output in its arena slot: copied there unless the kernel wrote it in place or
        allocated it there (the placed allocator)."""
        if value is slot:
            return slot
        if _same_place(value, slot):
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
        if self._placed is None:
            self._run_recompute(record)
            return
        with self._scratch_window(record.kernel):
            self._run_recompute(record)

    def _run_recompute(self, record: Recompute) -> None:
        self.state.enqueued += 1
        kernel = self.graph.kernels[record.kernel]
        args = [self._read(tid, FAST) for tid in kernel.inputs]
        # with an arena, the kept outputs go to the slots this record gives them; the dropped
        # ones are the re-run's scratch, as the packing counts them
        slots = [self._fast_slot(tid) if tid in record.outputs else None
                 for tid in kernel.outputs]
        outputs = self._run(kernel, args, slots)
        for tid, value, slot in zip(kernel.outputs, outputs, slots, strict=True):
            if tid not in record.outputs:
                continue
            if tid in self.state.fast:
                raise ExecutionError(f"recompute of {self.graph.name_of(tid)!r}: it is already "
                                     "in the fast tier")
            self.state.fast[tid] = value if slot is None else self._in_slot(value, slot)

    def _run(self, kernel: Any, args: list[torch.Tensor],
             slots: list[torch.Tensor | None] | None) -> list[torch.Tensor]:
        """Run a kernel. With slots (arena): written in place where it can be (each slot
        still at its planned address afterwards, and none shared with an input), else the raw
        outputs, which `compute` copies into their slots."""
        if slots is None or not any(s is not None for s in slots):
            return run_kernel(kernel, args)
        direct = all(s is not None and all(self._may_write(kernel, s, i, a)
                                           for i, a in enumerate(args))
                     for s in slots)
        if direct:
            where = [(s.data_ptr(), s.shape) for s in slots if s is not None]
            if run_kernel_into(kernel, args, slots):
                if [(s.data_ptr(), s.shape) for s in slots if s is not None] == where:
                    return slots  # type: ignore[return-value]
                raise ExecutionError(f"kernel {kernel.name!r} ({kernel.op_type}) moved or "
                                     "resized an output in its slot; its direct path is wrong")
        if self._placed is None:
            return run_kernel_raw(kernel, args)
        return self._run_placed(kernel, args, slots)

    def _run_placed(self, kernel: Any, args: list[torch.Tensor],
                    slots: list[torch.Tensor | None]) -> list[torch.Tensor]:
        """Run a kernel with no `out=` form so that the allocations of its outputs' sizes get
        their slots' addresses (`runtime.placed`); a slot an input still occupies is not
        offered. An output that landed in another output's slot (same size, allocated in
        another order) is moved out first, so that the copies into the slots overwrite nothing
        still to be read."""
        offered = [(s.data_ptr(), s.numel() * s.element_size()) for s in slots
                   if s is not None and not any(overlaps(s, a) for a in args)]
        with self._placed.expecting(offered):  # type: ignore[union-attr]
            outputs = run_kernel_raw(kernel, args)
        taken = {start for start, _ in offered}
        return [out.clone() if out.data_ptr() in taken and
                (slot is None or not _same_place(out, slot)) else out
                for out, slot in zip(outputs, slots, strict=True)]

    def _may_write(self, kernel: Any, slot: torch.Tensor, position: int,
                   arg: torch.Tensor) -> bool:
        """Whether a kernel may write into `slot` while it reads `arg`, its input at `position`:
        they do not meet, or `arg` is exactly the slot (an output taking its input's slot in
        place) and the kernel may overwrite that input (`OVERWRITES`); a copy still reading
        `arg` then finishes first."""
        if not overlaps(slot, arg):
            return True
        if position not in OVERWRITES.get(kernel.op_type, ()) or \
                slot.data_ptr() != arg.data_ptr() or \
                slot.numel() * slot.element_size() != arg.numel() * arg.element_size():
            return False
        self._wait_for_copy_out(kernel.inputs[position])
        return True

    def _wait_for_copy_out(self, tid: int) -> None:
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

    def _read(self, tid: int, tier: str) -> torch.Tensor:
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
            return
        self._store(to)[tid] = self._copy_cuda(tid, src, to, record.mode == "async")
        if record.mode == "async" and record.overlaps is not None and not JOIN_COPIES_AT_USE:
            # AutoTM's join at the end of the kernel it overlaps. Otherwise a copy is joined
            # where its tensor is next used: a prefetch where it is read (`_read`), written out
            # or freed, a write where its source is freed (`free`) or written over
            # (`_wait_for_copy_out`), a later read of the slow copy on its own stream
            # (`_copy_cuda`'s source event); so it overlaps every kernel until then.
            self.state.attached.setdefault(record.overlaps, []).append(
                self.state.pending[(tid, to)])

    def _copy_cuda(self, tid: int, src: torch.Tensor, to: str, asynchronous: bool) -> torch.Tensor:
        assert self.streams is not None
        current = self._compute
        name = "h2d" if to == FAST else "d2h"
        stream = getattr(self.streams, name) if asynchronous else current
        dst = self.pool.view(tid, self.graph.tensors[tid]) if to == SLOW else \
            self._fast_slot(tid, stream)
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
        # enqueued on the copy stream (set directly: the `torch.cuda.stream` context costs
        # more host time than the copy's own launch)
        torch.cuda.set_stream(stream)
        try:
            dst.copy_(src, non_blocking=True)
        finally:
            torch.cuda.set_stream(current)
        event = torch.cuda.Event()
        event.record(stream)
        self.state.pending[(tid, to)] = event
        return dst

    def free(self, record: Free) -> None:
        tid, tier = record.tensor, record.tier
        store = self._store(tier)
        pending = self.state.pending
        if pending:
            if self.cuda and tier == FAST:
                # A copy still reading (to slow) or writing (to fast) this memory must be done
                # before the compute stream frees it: the caching allocator may hand the block
                # to the next allocation on this stream at once (without `record_stream` the
                # memory is released in stream order, so the allocator's peak is the plan's).
                # In an arena the next tenant of the slot is known: it waits instead.
                for key in ((tid, SLOW), (tid, FAST)):
                    event = pending.get(key)
                    if event is None:
                        continue
                    if key[1] == SLOW and self.arena is not None and JOIN_COPIES_AT_USE \
                            and tid in store:
                        # at planned addresses the slot's next tenant waits instead (`_claim`)
                        self.state.busy.append((store[tid], event))
                    else:
                        self._join(event)
            pending.pop((tid, tier), None)
        try:
            del store[tid]
        except KeyError:
            raise ExecutionError(f"free of {self.graph.name_of(tid)!r}: not in the {tier} "
                                 "tier") from None

    def _store(self, tier: str) -> dict[int, torch.Tensor]:
        return self.state.fast if tier == FAST else self.state.slow

    # ---- CUDA graph ------------------------------------------------------------------------
    def warm_up(self) -> None:
        """One eager iteration on the stream that `capture` will use, so that cuBLAS and cuDNN
        set themselves up for it (a capture cannot) and pick the algorithms it will replay."""
        assert self.capture_stream is not None, "CUDA graphs need a CUDA device"
        current = torch.cuda.current_stream(self.device)
        self.capture_stream.wait_stream(current)
        with torch.cuda.stream(self.capture_stream):
            self.prepare()
            self.run()
        current.wait_stream(self.capture_stream)

    def capture(self) -> str | None:
        """Capture one iteration as a CUDA graph (after `warm_up`, with an arena or static
        inputs); later `replay()`s run it. Returns why it failed (the kernel and the error),
        None if not."""
        assert self.capture_stream is not None, "CUDA graphs need a CUDA device"
        self.prepare()
        graph = GraphReplay(self.run, self._where, self.capture_stream)
        if graph.failed is not None:
            self._drop_failed_capture()
            self.prepare()
            return graph.failed
        self._graph, self._end = graph, (self.state, self.carry)
        self.fence(True)
        return None

    def release(self) -> None:
        """Drop every device tensor the executor holds, after a run that failed: the
        exception's traceback keeps the executor alive until Python's cycle collector runs,
        and with it the iteration's memory (its arena, or a capture's pool), which counted
        against the next run's cap (on the H100, every later run of a sweep ran out of
        memory after one plan did)."""
        self.state, self.carry = _State(), {}
        self._graph = self._end = None
        self.fence(False)
        self.arena = self.slots = None
        _give_back(self.device if self.cuda else None)

    def _drop_failed_capture(self) -> None:
        """Let go of what a failed capture left: the tensors of its partial iteration live in
        the graph's private pool, and until they go (and the cache is emptied) that pool's
        blocks count against the cap of the eager iterations that follow (on the H100 a
        capture that ran out of memory under the cap left the plan's whole iteration reserved,
        and every later run of the process ran out of memory)."""
        self.state = _State()
        _give_back(self.device if self.cuda else None)

    def fence(self, on: bool) -> None:
        """While a captured graph may replay, nothing else gets the placed allocator's scratch
        that the graph's kernels write (torch's caching allocator keeps a capture's blocks in
        its private pool instead)."""
        if self._placed is not None:
            self._placed.fence(on)

    def replay(self) -> None:
        """Run the captured iteration (after `prepare()` placed its inputs); afterwards the
        executor holds the iteration's results as after `run()`."""
        if self._graph is None or self._end is None:
            raise ExecutionError("no captured iteration to replay; call capture() first")
        self._graph.replay()
        self.state, self.carry = self._end

    def _where(self) -> str:
        if 0 <= self.index < len(self.plan.records):
            return self.describe(self.plan.records[self.index])
        return "the start of the iteration" if self.index < 0 else "its end"

    # ---- results ---------------------------------------------------------------------------
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


def execute(graph: TensorGraph, plan: Plan, *, device: str = "cuda", iterations: int = 5,
            warmup: int = 2, seed: int = 0, kernel_times: bool = False,
            enforce_budget: bool = True, cap_slack_bytes: int = CAP_SLACK_BYTES,
            deterministic: bool = False, per_iteration_kernel_times: bool = False,
            allocator_settings: str | None = DEFAULT_ALLOCATOR_SETTINGS, arena: bool = False,
            graph_replay: bool = False, placed: bool = False,
            device_busy: bool = False) -> RunResult:
    """Run `warmup` + `iterations` iterations of a plan and measure the timed ones.
    `allocator_settings`: the CUDA caching allocator's settings (None: the environment's).
    `arena`: fast copies at the plan's planned offsets (`Plan.arena`); `graph_replay` (CUDA):
    the timed iterations replay one captured after the warm-up, with the arena where `arena`,
    else with static inputs (`runtime.arena.StaticInputs`: kernels' outputs come from the
    graph's private pool, none copied into a slot; nothing bounds that pool but the cap).
    `placed` (an arena on CUDA): install the placed allocator as torch's first
    (`runtime.placed`: kernels allocate their outputs at their slots; its region is the cap),
    possible only before the process first uses CUDA (else a note says the outputs were
    copied); it stays torch's allocator for the rest of the process. `device_busy` (CUDA):
    profile one more iteration and report how long the GPU worked in it
    (`RunResult.device_busy_s`)."""
    plan.validate(graph)
    if iterations < 1 or warmup < 0:
        raise ConfigError("--iterations must be >= 1 and --warmup >= 0")
    if graph_replay and (not device.startswith("cuda") or kernel_times):
        raise ConfigError("--graph replays a CUDA graph: it needs --device cuda, and it does "
                          "not time single kernels (no --kernel-times)")
    if device_busy and (not device.startswith("cuda") or kernel_times):
        raise ConfigError("--device-busy profiles what the GPU does: it needs --device cuda, "
                          "and not --kernel-times (whose events split the iteration)")
    not_placed = install_placed(plan, device, enforce_budget, cap_slack_bytes) \
        if placed and arena else None
    dev, executor = new_executor(graph, plan, device, seed, deterministic, kernel_times,
                                 allocator_settings=allocator_settings, arena=arena,
                                 static_inputs=graph_replay and not arena)
    cap = apply_cap(plan.header.budget_bytes, dev, enforce_budget, cap_slack_bytes)
    try:
        timed = _timed_iterations(executor, iterations, warmup, graph_replay, cap)
        activity = _profiled_iteration(executor, timed) if device_busy else None
    except BaseException as exc:
        _forget_frames(exc)
        executor.release()
        raise
    finally:
        executor.fence(False)
        if cap is not None:
            release_cap(dev)
    if not_placed is not None and executor.arena is not None:
        timed.notes.append(not_placed)
    queues = replay_work_queues_note() if timed.replayed else None
    if queues is not None:
        timed.notes.append(queues)
    if executor.spills:
        timed.notes.append(spill_note(executor.spills))
    if executor._placed is not None:
        misses = executor._placed.misses()
        if misses:
            timed.notes.append(miss_note(graph, plan, misses))
    if cap is not None and timed.capture_reserved is not None and timed.capture_reserved > cap:
        timed.notes.append(
            f"the capture held {(timed.capture_reserved - cap) / 2**20:.0f} MiB more than the "
            "cap once (its private pool beside the warm-up's blocks; allowance "
            f"{CAPTURE_ALLOWANCE >> 20} MiB); the replays ran under the cap")
    return RunResult(
        device=dev, device_name=device_name(dev), iterations=iterations, warmup=warmup,
        iteration_times_s=tuple(timed.times), median_s=statistics.median(timed.times),
        kernel_times_s=tuple(statistics.median(c) for c in zip(*timed.kernels, strict=True))
        if timed.kernels else None, peak_fast_bytes=timed.peak,
        modelled_peak_fast_bytes=plan.header.counts.get("fast_peak_bytes"),
        budget_bytes=plan.header.budget_bytes, cap_bytes=cap,
        predicted_time_s=plan.header.predicted_time_s, slow_pool_bytes=executor.pool.nbytes,
        strategy=plan.header.strategy, model_name=graph.name,
        notes=((f"cap = budget + {cap_slack_bytes >> 20} MiB slack for library workspaces",)
               if cap is not None else ()) + tuple(timed.notes),
        kernel_samples_s=tuple(tuple(s) for s in timed.kernels) if per_iteration_kernel_times
        else None,
        host_median_s=statistics.median(timed.host_times),
        alloc_retries=timed.alloc_retries, reserved_peak_bytes=timed.reserved,
        arena_bytes=None if executor.arena is None else executor.arena.nbytes,
        copied_outputs=None if executor.slots is None else timed.copied,
        graph=timed.replayed, capture_reserved_bytes=timed.capture_reserved,
        placed_outputs=None if executor._placed is None else timed.placed,
        device_busy_s=None if activity is None else activity.busy_s,
        device_span_s=None if activity is None else activity.span_s,
        device_kernel_s=None if activity is None else activity.kernel_s,
    )


def _profiled_iteration(executor: Executor, timed: _Timed):
    """One more iteration, as the timed ones ran (replayed or eager), under the profiler:
    the device's busy time in it (`runtime.device_trace`). After the timed iterations, so
    that tracing does not touch their times."""
    from autotm_py.runtime.device_trace import profile_device

    executor.prepare()
    try:
        return profile_device(executor.replay if timed.replayed else executor.run,
                              executor.device)
    except torch.OutOfMemoryError as exc:
        raise ExecutionError(_out_of_memory(executor, exc)) from None


def _same_place(value: torch.Tensor, slot: torch.Tensor) -> bool:
    """Whether `value` is already the contents of `slot`: the same bytes, laid out alike."""
    return value.data_ptr() == slot.data_ptr() and value.dtype == slot.dtype and \
        value.shape == slot.shape and value.stride() == slot.stride()


def install_placed(plan: Plan, device: str, enforce_budget: bool = True,
                   slack: int = CAP_SLACK_BYTES) -> str | None:
    """The placed allocator as torch's for an arena run of `plan` on CUDA (`runtime.placed`),
    its region the run's cap (budget + slack; uncapped: the device's free memory). Call it
    before anything uses CUDA in the process (`execute` calls it too, too late where costs
    were looked up on the GPU before). Returns a note if it could not be installed."""
    if not device.startswith("cuda"):
        return None
    budget = plan.header.budget_bytes if enforce_budget else None
    why = placed.install(None if budget is None else budget + slack)
    return None if why is None else \
        f"outputs copied into their slots: no placed allocator ({why})"


def spill_note(spills: Mapping[str, tuple[int, int]], shown: int = 3) -> str:
    """What a run says when kernels asked for more scratch than their windows hold (their
    requests then came from the region beyond the arena, or overflowed it): the largest ones."""
    worst = sorted(spills.items(), key=lambda kv: -kv[1][0])
    parts = [f"{name!r} {largest / 2**20:.0f} MiB (window {window / 2**20:.0f} MiB)"
             for name, (largest, window) in worst[:shown]]
    more = f" and {len(worst) - shown} more" if len(worst) > shown else ""
    return (f"scratch beyond its window at {len(spills)} kernel(s), largest requests: "
            f"{', '.join(parts)}{more}; served beside the arena (their profile's workspace "
            "is smaller than what they allocate here: profile on this GPU)")


def miss_note(graph: TensorGraph, plan: Plan, misses: list[tuple[int, int]],
              shown: int = 4) -> str:
    """Where the placed allocator's region (the cap) had no room: the largest requests that
    went beyond it, with the records that made them (-1: between kernels)."""
    parts = []
    for record, nbytes in misses[:shown]:
        step = plan.records[record] if 0 <= record < len(plan.records) else None
        kernel = getattr(step, "kernel", None)
        where = "between kernels" if kernel is None else \
            f"at {graph.kernels[kernel].name!r} (record #{record})"
        parts.append(f"{nbytes / 2**20:.1f} MiB {where}")
    return ("requests beyond the cap (the placed allocator's region had no room), largest: "
            + ", ".join(parts))


def _give_back(device: torch.device | None) -> None:
    """Return what a failed run or capture no longer references to the driver: the collector
    first (an error's traceback may hold the last references to its tensors in a cycle), then
    the allocator's cache, so that it does not count against the next run's cap."""
    gc.collect()
    if device is not None:
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def _forget_frames(exc: BaseException) -> None:
    """Clear the local variables of the finished frames in `exc`'s traceback and in those of
    the errors it arose from (the out-of-memory under an `ExecutionError`): the executor's
    loops hold the iteration's state and the kernels their tensors in locals, which the
    caller's traceback would otherwise keep allocated."""
    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        traceback.clear_frames(error.__traceback__)
        error = error.__context__


def new_executor(graph: TensorGraph, plan: Plan, device: str, seed: int = 0,
                 deterministic: bool = False, kernel_times: bool = False,
                 kernel_ranges: bool = False, *,
                 allocator_settings: str | None = DEFAULT_ALLOCATOR_SETTINGS,
                 arena: bool = False, static_inputs: bool = False) -> tuple[str, Executor]:
    """The checked device and an executor on it, with the initial values drawn from `seed`
    (untimed; `execute` and `run_steps` drive it, experiments may too)."""
    from autotm_py.runtime.reference import init_values

    dev = check_device(device)
    if dev.startswith("cuda"):
        configure_cuda(deterministic, allocator_settings)
    masters = {tid: v.cpu() for tid, v in init_values(graph, seed=seed, device="cpu").items()}
    return dev, Executor(graph, plan, device=dev, masters=masters, kernel_times=kernel_times,
                         kernel_ranges=kernel_ranges, arena=arena, static_inputs=static_inputs)


@dataclass
class _Timed:
    times: list[float] = field(default_factory=list)
    host_times: list[float] = field(default_factory=list)
    kernels: list[list[float]] = field(default_factory=list)
    peak: int | None = None
    reserved: int | None = None
    alloc_retries: int | None = None
    copied: int = 0  # outputs copied into arena slots, per iteration
    placed: int = 0  # outputs allocated at their slots, per iteration
    replayed: bool = False
    capture_reserved: int | None = None
    notes: list[str] = field(default_factory=list)


# How much more than the cap a capture in an arena may hold, once, under a capped run.
# Capturing allocates kernels' scratch from the graph's private pool, which cannot reuse the
# blocks the eager warm-up left in the default pool (nor they its), so for the capture's
# duration both pools hold memory; measured on the H100 (docs/gpu.md), joint plans that replay
# within budget + 64 MiB failed their capture under that cap. The replays allocate nothing:
# they run under the cap. A capture with static inputs gets no allowance: its private pool
# holds the whole iteration and stays reserved while the graph replays, so the capture itself
# must fit the cap.
CAPTURE_ALLOWANCE = 256 << 20


def _capture(executor: Executor, cap: int | None) -> tuple[str | None, int | None]:
    """Capture the iteration (`Executor.capture`); under a cap in an arena, with
    `CAPTURE_ALLOWANCE` more for the capture's duration. Returns why it failed (None if not)
    and, on a GPU, the most the allocator reserved meanwhile."""
    if not executor.cuda:
        return executor.capture(), None
    # Count the capture alone: the eager iterations before it left blocks cached on two
    # streams (the timed loop's and the capture's), which the capture returns anyway; the
    # last one's outputs go now (its carried values stay for the capture's `prepare`).
    executor.state = _State()
    torch.cuda.synchronize(executor.device)
    torch.cuda.empty_cache()
    reset_peaks(executor.device)
    allowance = cap is not None and executor.arena is not None
    if allowance:
        set_cap(executor.device, cap + CAPTURE_ALLOWANCE)
    try:
        failed = executor.capture()
    finally:
        if allowance:
            set_cap(executor.device, cap)
    return failed, peaks(executor.device)[1]


def _warm_up_to_capture(executor: Executor) -> None:
    """`Executor.warm_up` (an eager iteration on the capture's stream), after freeing the
    cuBLAS workspaces of the streams that ran before: from now on only the capture's stream
    runs kernels (the replays run what it captured), and theirs would sit in the cap unused."""
    if executor.cuda:
        release_blas_workspaces(executor.device)
    executor.warm_up()


def _timed_iterations(executor: Executor, iterations: int, warmup: int,
                      graph: bool = False, cap: int | None = None) -> _Timed:
    timed = _Timed(alloc_retries=0 if executor.cuda else None)
    if graph and not warmup:  # kernels set themselves up (cuBLAS, cuDNN) outside a capture
        _warm_up_to_capture(executor)
    for i in range(warmup + iterations):
        if graph and i == warmup - 1:
            _warm_up_to_capture(executor)  # untimed
            continue
        if graph and i == warmup:
            failed, timed.capture_reserved = _capture(executor, cap)
            timed.replayed = failed is None
            if failed is not None:
                timed.notes.append(f"no CUDA graph: capture failed at {failed}; ran eagerly"
                                   + eager_work_queues_note())
        executor.prepare()  # untimed: placing the iteration's inputs, like a data loader
        executor.state.copied = executor.state.placed = 0
        # eager until the capture (the warm-up iterations), replays after it
        step = executor.replay if timed.replayed else executor.run
        try:
            sample = time_region(executor.device, step)
        except torch.OutOfMemoryError as exc:
            raise ExecutionError(_out_of_memory(executor, exc)) from None
        if i < warmup:
            continue
        timed.times.append(sample.seconds)
        timed.host_times.append(sample.host_seconds)
        if timed.alloc_retries is not None:
            timed.alloc_retries += sample.retries
        if sample.peak is not None:
            timed.peak = max(timed.peak or 0, sample.peak)
            timed.reserved = max(timed.reserved or 0, sample.reserved or 0)
        timed.copied, timed.placed = executor.state.copied, executor.state.placed
        if executor.kernel_times and executor.cuda:
            timed.kernels.append(executor.kernel_seconds())
    return timed


def _out_of_memory(executor: Executor, exc: BaseException) -> str:
    where = f"{_oom_request(exc)} at {executor._where()}"
    if executor.arena is not None:
        return (f"the plan ran out of fast memory under its cap ({where}): a kernel's scratch "
                "(its workspace, or outputs that torch allocates) did not fit beside the "
                "arena; plan with `autotm optimize --arena` (which leaves the scratch region), "
                "or run with --no-cap to measure it")
    return (f"the plan ran out of fast memory under its cap ({where}): the allocator's "
            "fragmentation needs room the plan does not leave; plan with `autotm optimize "
            "--arena` and run with --arena, or re-plan with --headroom 0.1 (or `autotm bench "
            "--execute --fit`)")


def _oom_request(exc: BaseException) -> str:
    """'tried to allocate 76.00 MiB' from torch's out-of-memory message (else its first
    sentence): with the record it happened at, what a re-plan needs to leave room for."""
    found = re.search(r"Tried to allocate ([\d.]+ [KMGT]?i?B)", str(exc))
    return f"tried to allocate {found.group(1)}" if found else _first_sentence(exc)


def _first_sentence(exc: BaseException) -> str:
    return str(exc).split(". ")[0].strip()


def run_steps(graph: TensorGraph, plan: Plan, *, steps: int = 3, device: str = "cpu",
              seed: int = 0, deterministic: bool = True, arena: bool = False,
              graph_replay: bool = False, placed: bool = False) -> list[dict[int, torch.Tensor]]:
    """Execute `steps` iterations (untimed) and return each step's graph outputs on the CPU:
    the values to compare with `reference.train_steps` and with other plans. `arena`: at the
    planned offsets; `graph_replay` (CUDA): the first step eager, the others replays of a CUDA
    graph captured after it (an `ExecutionError` if the capture fails). `placed`: as for
    `execute`."""
    plan.validate(graph)
    if placed and arena:
        install_placed(plan, device, enforce_budget=False)
    _, executor = new_executor(graph, plan, device, seed, deterministic, arena=arena,
                               static_inputs=graph_replay and not arena)
    try:
        return _steps(executor, graph, steps, graph_replay)
    finally:
        executor.fence(False)


def _steps(executor: Executor, graph: TensorGraph, steps: int,
           graph_replay: bool) -> list[dict[int, torch.Tensor]]:
    results = []
    for step in range(steps):
        if graph_replay and step == 1:
            failed = executor.capture()
            if failed is not None:
                raise ExecutionError(f"CUDA graph capture failed at {failed}")
        if graph_replay and step == 0:
            executor.warm_up()
        elif graph_replay:
            executor.prepare()
            executor.replay()
        else:
            executor.prepare()
            executor.run()
        results.append({t: executor.value(t).detach().cpu().clone() for t in graph.outputs})
    return results
