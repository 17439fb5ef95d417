"""`Executor`: runs a plan for real with torch and measures it.

GPU (``device="cuda"``): compute runs on the current (default) stream; host->device and
device->host copies run on two dedicated copy streams, ordered with events, so they overlap with
compute and with each other. The slow tier is one pinned host pool, allocated once and reused
across iterations (a `cudaHostAlloc` per tensor would cost milliseconds each). Every tensor is
allocated and freed on the compute stream, and freed only after the compute stream has waited for
any copy that touches it, so the caching allocator reuses memory in stream order and its peak is
the plan's (`record_stream` would hold blocks until the host sees the copy end). The budget is
enforced with `torch.cuda.set_per_process_memory_fraction`, and the measured peak
(`max_memory_allocated`) is reported beside the modelled one.

CPU (``device="cpu"``): the same records with real copies between two host dictionaries; this
checks a plan's correctness (results are bitwise equal between plans, since moves are copies).

Semantics follow `autotm_py.plan` and the planner's model: an async move issued before
``Compute(k)`` starts when kernel k starts (the copy stream waits for the work enqueued before
k) and joins at k's end (the compute stream waits for it after k), so a step lasts
max(kernel, its copies of each direction); a sync move is ordered on the compute stream.
"""

from __future__ import annotations

import itertools
import logging
import statistics
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from autotm_py.errors import ConfigError, ExecutionError
from autotm_py.interpreter import PlanInterpreter
from autotm_py.ir.graph import Role
from autotm_py.kernels import run_kernel
from autotm_py.memory.tiers import FAST, SLOW
from autotm_py.plan import Compute, Free, Move, Plan, Recompute
from autotm_py.runtime.device import (
    DEFAULT_ALLOCATOR_SETTINGS,
    apply_cap,
    check_device,
    configure_cuda,
    device_name,
    release_cap,
    time_region,
)
from autotm_py.runtime.pinned import PinnedPool, slow_tier_layout

if TYPE_CHECKING:
    from autotm_py.ir.graph import TensorGraph

log = logging.getLogger(__name__)

# Roles re-materialized (untimed) at the start of every iteration from host master copies: the
# data batch and constants. Weights and optimizer state carry over from the previous iteration.
_REFRESHED_ROLES = (Role.INPUT, Role.LABEL, Role.CONSTANT)
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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Streams:
    h2d: Any
    d2h: Any


@dataclass
class _State:
    fast: dict[int, torch.Tensor] = field(default_factory=dict)
    slow: dict[int, torch.Tensor] = field(default_factory=dict)
    pending: dict[tuple[int, str], Any] = field(default_factory=dict)  # copy events
    attached: dict[int, list[Any]] = field(default_factory=dict)  # kernel -> its async copies


class Executor(PlanInterpreter):
    """Executes one iteration per `run()`; `values` carries weights between iterations."""

    def __init__(self, graph: TensorGraph, plan: Plan, *, device: str,
                 masters: Mapping[int, torch.Tensor], kernel_times: bool = False,
                 kernel_ranges: bool = False) -> None:
        super().__init__(graph, plan)
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.masters = masters  # host copies of every no-producer tensor (initial values)
        self.kernel_times = kernel_times
        # each kernel inside a profiler range named KERNEL_RANGE + id (device-time profiling)
        self.kernel_ranges = kernel_ranges
        self.state = _State()
        self.carry: dict[int, tuple[str, torch.Tensor]] = {}
        self.streams = _Streams(torch.cuda.Stream(self.device), torch.cuda.Stream(self.device)) \
            if self.cuda else None
        offsets, nbytes = slow_tier_layout(graph, plan)
        self.pool = PinnedPool(offsets, nbytes, pin=self.cuda)
        self._kernel_events: list[Any] = []

    # ---- iteration boundaries ------------------------------------------------------------
    def prepare(self) -> None:
        """Place every given tensor where the plan starts it (untimed, like a data loader)."""
        self.state = _State()
        self._kernel_events = []
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
        if self.kernel_times and self.cuda:
            first = torch.cuda.Event(enable_timing=True)
            first.record()
            self._kernel_events = [first]

    def _place_initial(self, tid: int, tiers: tuple[str, ...]) -> None:
        carried = self.carry.get(tid)
        for tier in tiers:
            if carried is not None and carried[0] == tier:
                self._store(tier)[tid] = carried[1]
            else:
                source = carried[1] if carried is not None else self.masters[tid]
                self._store(tier)[tid] = self._materialize(tid, source, tier)

    def _materialize(self, tid: int, source: torch.Tensor, tier: str) -> torch.Tensor:
        if tier == SLOW:
            dst = self.pool.view(tid, self.graph.tensors[tid])
            dst.copy_(source)
            return dst
        return source.to(self.device, copy=True)

    def finish(self) -> None:
        """Join the copy streams, then hand each carried value to the next iteration."""
        if self.streams is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_stream(self.streams.h2d)
            current.wait_stream(self.streams.d2h)
        self.carry = {}
        for first, last in self.graph.carried:
            self.carry[first] = self._final_copy(first, last)

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
        kernel = self.graph.kernels[record.kernel]
        n_in = len(kernel.inputs)
        args = [self._read(tid, record.placement[i]) for i, tid in enumerate(kernel.inputs)]
        if self.kernel_ranges:
            with torch.profiler.record_function(f"{KERNEL_RANGE}{record.kernel}"):
                outputs = run_kernel(kernel, args)
        else:
            outputs = run_kernel(kernel, args)
        for event in self.state.attached.pop(record.kernel, ()):
            # AutoTM's join: the copies overlapped with this kernel finish with it, as the
            # planner and the simulator assume (a step lasts max(kernel, its copies)).
            torch.cuda.current_stream(self.device).wait_event(event)
        if self.kernel_times and self.cuda:
            # One event after each kernel: a kernel's time is the interval since the previous
            # event, i.e. what it adds to the iteration (dispatch gaps included), so the
            # kernel times sum to the iteration's time.
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._kernel_events.append(end)
        for j, (tid, value) in enumerate(zip(kernel.outputs, outputs, strict=True)):
            tier = record.placement[n_in + j]
            if tier == SLOW and self.cuda:
                raise ExecutionError(f"kernel {kernel.name!r} writes {self.graph.name_of(tid)!r} "
                                     "to the slow tier; on a GPU every output is in fast memory")
            self._store(tier)[tid] = value

    def recompute(self, record: Recompute) -> None:
        """Re-run a forward kernel on the compute stream, before the next kernel, and keep the
        outputs the record names in fast memory (the others are dropped at once). The kernels
        are deterministic, so the regenerated values equal the first ones bit for bit (on CUDA
        with deterministic algorithms)."""
        kernel = self.graph.kernels[record.kernel]
        args = [self._read(tid, FAST) for tid in kernel.inputs]
        outputs = run_kernel(kernel, args)
        for tid, value in zip(kernel.outputs, outputs, strict=True):
            if tid not in record.outputs:
                continue
            if tid in self.state.fast:
                raise ExecutionError(f"recompute of {self.graph.name_of(tid)!r}: it is already "
                                     "in the fast tier")
            self.state.fast[tid] = value

    def _read(self, tid: int, tier: str) -> torch.Tensor:
        store = self._store(tier)
        if tid not in store:
            raise ExecutionError(f"tensor {self.graph.name_of(tid)!r} is not in the {tier} tier")
        event = self.state.pending.pop((tid, tier), None)
        if event is not None:
            torch.cuda.current_stream(self.device).wait_event(event)
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
        if record.mode == "async" and record.overlaps is not None:
            self.state.attached.setdefault(record.overlaps, []).append(
                self.state.pending[(tid, to)])

    def _copy_cuda(self, tid: int, src: torch.Tensor, to: str, asynchronous: bool) -> torch.Tensor:
        assert self.streams is not None
        current = torch.cuda.current_stream(self.device)
        dst = self.pool.view(tid, self.graph.tensors[tid]) if to == SLOW else \
            torch.empty_like(src, device=self.device)
        source_event = self.state.pending.get((tid, SLOW if to == FAST else FAST))
        stream = (self.streams.h2d if to == FAST else self.streams.d2h) if asynchronous \
            else current
        if stream is not current:
            # Start when the kernel it overlaps starts: after everything enqueued so far, which
            # also protects freshly allocated memory that earlier kernels may still be using.
            stream.wait_stream(current)
        if source_event is not None:
            stream.wait_event(source_event)
        with torch.cuda.stream(stream):
            dst.copy_(src, non_blocking=True)
        if stream is not current:
            event = torch.cuda.Event()
            event.record(stream)
            self.state.pending[(tid, to)] = event
        return dst

    def free(self, record: Free) -> None:
        tid, tier = record.tensor, record.tier
        store = self._store(tier)
        if tid not in store:
            raise ExecutionError(f"free of {self.graph.name_of(tid)!r}: not in the {tier} "
                                 "tier")
        if self.cuda and tier == FAST:
            # A copy still reading (to slow) or writing (to fast) this memory must be done
            # before the compute stream frees it: the caching allocator may hand the block to
            # the next allocation on this stream at once. Usually the join after the overlapped
            # kernel has already ordered it, and the wait is free. Without `record_stream`, the
            # memory is released in stream order, so the allocator's peak is the plan's.
            for key in ((tid, SLOW), (tid, FAST)):
                event = self.state.pending.get(key)
                if event is not None:
                    torch.cuda.current_stream(self.device).wait_event(event)
        del store[tid]
        self.state.pending.pop((tid, tier), None)

    def _store(self, tier: str) -> dict[int, torch.Tensor]:
        return self.state.fast if tier == FAST else self.state.slow

    # ---- results ---------------------------------------------------------------------------
    def kernel_seconds(self) -> list[float]:
        events = self._kernel_events
        return [a.elapsed_time(b) / 1e3 for a, b in itertools.pairwise(events)]

    def value(self, tid: int) -> torch.Tensor:
        """The final value of a tensor still held after `run()` (fast copy first)."""
        for store in (self.state.fast, self.state.slow):
            if tid in store:
                return store[tid]
        raise ExecutionError(f"tensor {self.graph.name_of(tid)!r} is not held after the run")


def execute(graph: TensorGraph, plan: Plan, *, device: str = "cuda", iterations: int = 5,
            warmup: int = 2, seed: int = 0, kernel_times: bool = False,
            enforce_budget: bool = True, cap_slack_bytes: int = 64 << 20,
            deterministic: bool = False, per_iteration_kernel_times: bool = False,
            allocator_settings: str | None = DEFAULT_ALLOCATOR_SETTINGS) -> RunResult:
    """Run `warmup` + `iterations` iterations of a plan and measure the timed ones.
    `allocator_settings`: the CUDA caching allocator's settings (None: the environment's)."""
    plan.validate(graph)
    if iterations < 1 or warmup < 0:
        raise ConfigError("--iterations must be >= 1 and --warmup >= 0")
    dev, executor = new_executor(graph, plan, device, seed, deterministic, kernel_times,
                                 allocator_settings=allocator_settings)
    cap = apply_cap(plan.header.budget_bytes, dev, enforce_budget, cap_slack_bytes)
    try:
        timed = _timed_iterations(executor, iterations, warmup)
    finally:
        if cap is not None:
            release_cap(dev)
    return RunResult(
        device=dev, device_name=device_name(dev), iterations=iterations, warmup=warmup,
        iteration_times_s=tuple(timed.times), median_s=statistics.median(timed.times),
        kernel_times_s=tuple(statistics.median(c) for c in zip(*timed.kernels, strict=True))
        if timed.kernels else None, peak_fast_bytes=timed.peak,
        modelled_peak_fast_bytes=plan.header.counts.get("fast_peak_bytes"),
        budget_bytes=plan.header.budget_bytes, cap_bytes=cap,
        predicted_time_s=plan.header.predicted_time_s, slow_pool_bytes=executor.pool.nbytes,
        strategy=plan.header.strategy, model_name=graph.name,
        notes=(f"cap = budget + {cap_slack_bytes >> 20} MiB slack for library workspaces",)
        if cap is not None else (),
        kernel_samples_s=tuple(tuple(s) for s in timed.kernels) if per_iteration_kernel_times
        else None,
        host_median_s=statistics.median(timed.host_times),
        alloc_retries=timed.alloc_retries,
    )


def new_executor(graph: TensorGraph, plan: Plan, device: str, seed: int = 0,
                 deterministic: bool = False, kernel_times: bool = False,
                 kernel_ranges: bool = False, *,
                 allocator_settings: str | None = DEFAULT_ALLOCATOR_SETTINGS
                 ) -> tuple[str, Executor]:
    """The checked device and an executor on it, with the initial values drawn from `seed`
    (untimed; `execute` and `run_steps` drive it, experiments may too)."""
    from autotm_py.runtime.reference import init_values

    dev = check_device(device)
    if dev.startswith("cuda"):
        configure_cuda(deterministic, allocator_settings)
    masters = {tid: v.cpu() for tid, v in init_values(graph, seed=seed, device="cpu").items()}
    return dev, Executor(graph, plan, device=dev, masters=masters, kernel_times=kernel_times,
                         kernel_ranges=kernel_ranges)


@dataclass
class _Timed:
    times: list[float] = field(default_factory=list)
    host_times: list[float] = field(default_factory=list)
    kernels: list[list[float]] = field(default_factory=list)
    peak: int | None = None
    alloc_retries: int | None = None


def _timed_iterations(executor: Executor, iterations: int, warmup: int) -> _Timed:
    timed = _Timed(alloc_retries=0 if executor.cuda else None)
    for i in range(warmup + iterations):
        executor.prepare()  # untimed: placing the iteration's inputs, like a data loader
        try:
            sample = time_region(executor.device, executor.run)
        except torch.OutOfMemoryError as exc:
            raise ExecutionError(
                f"the plan ran out of fast memory under its cap ({_first_sentence(exc)}): the "
                "allocator's fragmentation needs room the plan does not leave; re-plan with "
                "--headroom 0.1 (or `autotm bench --execute --fit`)") from None
        if i < warmup:
            continue
        timed.times.append(sample.seconds)
        timed.host_times.append(sample.host_seconds)
        if timed.alloc_retries is not None:
            timed.alloc_retries += sample.retries
        if sample.peak is not None:
            timed.peak = max(timed.peak or 0, sample.peak)
        if executor.kernel_times and executor.cuda:
            timed.kernels.append(executor.kernel_seconds())
    return timed


def _first_sentence(exc: BaseException) -> str:
    return str(exc).split(". ")[0].strip()


def run_steps(graph: TensorGraph, plan: Plan, *, steps: int = 3, device: str = "cpu",
              seed: int = 0, deterministic: bool = True) -> list[dict[int, torch.Tensor]]:
    """Execute `steps` iterations (untimed) and return each step's graph outputs on the CPU:
    the values to compare with `reference.train_steps` and with other plans."""
    plan.validate(graph)
    _, executor = new_executor(graph, plan, device, seed, deterministic)
    results = []
    for _ in range(steps):
        executor.prepare()
        executor.run()
        results.append({t: executor.value(t).detach().cpu().clone() for t in graph.outputs})
    return results
