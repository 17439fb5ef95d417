"""A plan run for real: the executor composed from a run mode, timed, and its `RunResult`.

`compose` is the one place where a run mode (`options.RunMode`) becomes an executor: a memory
strategy (`runtime.memory`: torch's caching allocator, static inputs for a replay without an
arena, or the arena at planned addresses) under the record interpreter (`runtime.executor`),
and a driver (`runtime.drivers`: eager, or CUDA-graph capture and replay). `execute` times
`measure.warmup + measure.iterations` iterations of it under the plan's cap; `run_steps`
runs untimed steps and returns their outputs (the tests' comparisons with torch.autograd).

On CUDA the budget is enforced with `torch.cuda.set_per_process_memory_fraction` (or the
placed allocator's region, `runtime.placed`), and the measured peak is reported beside the
modelled one.
"""

from __future__ import annotations

import re
import statistics
import traceback
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from autotm_py.errors import ConfigError, ExecutionError
from autotm_py.options import Measure, RunMode, check_run
from autotm_py.runtime import placed
from autotm_py.runtime.device import (
    apply_cap,
    check_budget_room,
    check_device,
    configure_cuda,
    device_name,
    release_cap,
    replay_work_queues_note,
    time_region,
)
from autotm_py.runtime.drivers import (
    CAPTURE_ALLOWANCE,
    EagerDriver,
    ReplayDriver,
    give_back,
)
from autotm_py.runtime.executor import Executor
from autotm_py.runtime.memory import ArenaMemory, CachingMemory

if TYPE_CHECKING:
    from autotm_py.ir.graph import TensorGraph
    from autotm_py.plan import Plan

Values = Mapping[int, torch.Tensor]


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
    # outputs per iteration copied into their slots (the rest were written in place).
    # `replayed`: the timed iterations were CUDA-graph replays; `capture_reserved_bytes`: the
    # most the allocator held while capturing it (once, before the timed replays:
    # `CAPTURE_ALLOWANCE`).
    reserved_peak_bytes: int | None = None
    arena_bytes: int | None = None
    copied_outputs: int | None = None
    replayed: bool = False
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
    # the run mode the iterations ran in (`options.RunMode`, as a dict)
    mode: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def memory_for(graph: TensorGraph, plan: Plan, device: torch.device, mode: RunMode, *,
               timing_kernels: bool = False) -> CachingMemory:
    """The memory strategy of a run mode: the arena (`mode.arena`, a plan with one), static
    inputs (a replay without an arena), or torch's caching allocator."""
    if mode.arena:
        if plan.arena is None:
            raise ConfigError("the plan has no arena: plan with `autotm optimize --arena`, or "
                              "pack it first (`api.with_arena`)")
        return ArenaMemory(plan.arena, device, graph, plan, sgd_foreach=not timing_kernels)
    return CachingMemory(graph, plan, device, static_inputs=mode.replay,
                         sgd_foreach=not timing_kernels)


def compose(graph: TensorGraph, plan: Plan, device: str, mode: RunMode, masters: Values, *,
            kernel_times: bool = False, kernel_ranges: bool = False
            ) -> tuple[Executor, EagerDriver]:
    """An executor of `plan` on `device` whose memory strategy and driver are `mode`'s."""
    timing = kernel_times or kernel_ranges
    memory = memory_for(graph, plan, torch.device(device), mode, timing_kernels=timing)
    executor = Executor(graph, plan, device=device, masters=masters, memory=memory,
                        kernel_times=kernel_times, kernel_ranges=kernel_ranges)
    driver = ReplayDriver(executor) if mode.replay else EagerDriver(executor)
    return executor, driver


def new_executor(graph: TensorGraph, plan: Plan, device: str, seed: int = 0,
                 deterministic: bool = False, kernel_times: bool = False,
                 kernel_ranges: bool = False, *, mode: RunMode | None = None,
                 masters: Values | None = None,
                 allocator_settings: str | None = Measure.allocator_settings,
                 ) -> tuple[str, Executor, EagerDriver]:
    """The checked device, and an executor and its driver on it, with the initial values
    `masters` (else drawn from `seed`; untimed). `execute` and `run_steps` drive them,
    experiments may too."""
    from autotm_py.runtime.reference import init_values

    dev = check_device(device)
    if dev.startswith("cuda"):
        configure_cuda(deterministic, allocator_settings)
    if masters is None:
        masters = {tid: v.cpu() for tid, v in init_values(graph, seed=seed,
                                                             device="cpu").items()}
    executor, driver = compose(graph, plan, dev, mode or RunMode(), masters,
                               kernel_times=kernel_times, kernel_ranges=kernel_ranges)
    return dev, executor, driver


def install_placed(budget_bytes: int | None, device: str, capped: bool = True,
                   slack: int = Measure.cap_slack_bytes) -> str | None:
    """The placed allocator as torch's for an arena run on CUDA (`runtime.placed`), its region
    the run's cap (`budget_bytes` + slack; uncapped or no budget: the device's free memory).
    Call it before anything uses CUDA in the process (`execute` calls it too, too late where
    costs were looked up on the GPU before). Returns a note if it could not be installed."""
    if not device.startswith("cuda"):
        return None
    budget = budget_bytes if capped else None
    why = placed.install(None if budget is None else budget + slack)
    return None if why is None else \
        f"outputs copied into their slots: no placed allocator ({why})"


def execute(graph: TensorGraph, plan: Plan, *, device: str = "cuda",
            mode: RunMode | None = None, measure: Measure | None = None,
            masters: Values | None = None) -> RunResult:
    """Run `measure.warmup` + `measure.iterations` iterations of a plan in `mode` and
    measure the timed ones. `mode.arena`: fast copies at the plan's planned offsets
    (`Plan.arena`); `mode.replay` (CUDA): the timed iterations replay one captured after the
    warm-up, with the arena where `mode.arena`, else with static inputs (kernels' outputs come
    from the graph's private pool, none copied into a slot; nothing bounds that pool but the
    cap). `mode.placed` (an arena on CUDA): install the placed allocator as torch's first
    (`runtime.placed`), possible only before the process first uses CUDA (else a note says the
    outputs were copied); it stays torch's allocator for the rest of the process. `masters`:
    the initial values (else seeded random ones)."""
    mode, measure = mode or RunMode(), measure or Measure()
    plan.validate(graph)
    check_run(device, mode, measure)
    not_placed = install_placed(plan.header.budget_bytes, device, measure.capped,
                                measure.cap_slack_bytes) \
        if mode.places_outputs else None
    if mode.arena:  # before the arena's first copy fails with CUDA's "invalid argument"
        check_budget_room(plan.header.budget_bytes, device, "the plan")
    dev, executor, driver = new_executor(
        graph, plan, device, measure.seed, measure.deterministic, measure.kernel_times,
        mode=mode, masters=masters, allocator_settings=measure.allocator_settings)
    cap = apply_cap(plan.header.budget_bytes, dev, measure.capped, measure.cap_slack_bytes)
    try:
        timed = _timed_iterations(executor, driver, measure, cap)
        activity = _profiled_iteration(executor, driver) if measure.device_busy else None
    except BaseException as exc:
        _forget_frames(exc)
        driver.release()
        executor.release()
        give_back(executor.device)
        raise
    finally:
        executor.memory.fence(False)
        if cap is not None:
            release_cap(dev)
    notes = _run_notes(executor, driver, timed, cap, measure, not_placed)
    return _result(executor, driver, timed, cap, measure, mode, notes, activity)


@dataclass
class _Timed:
    times: list[float] = field(default_factory=list)
    host_times: list[float] = field(default_factory=list)
    kernels: list[list[float]] = field(default_factory=list)
    peak: int | None = None
    reserved: int | None = None
    alloc_retries: int | None = None
    copied: int = 0  # outputs copied into slots, per iteration
    placed: int = 0  # outputs allocated at their slots, per iteration


def _timed_iterations(executor: Executor, driver: EagerDriver, measure: Measure,
                      cap: int | None) -> _Timed:
    timed = _Timed(alloc_retries=0 if executor.cuda else None)
    for i in range(measure.warmup + measure.iterations):
        if not driver.begin(i, measure.warmup, cap):
            continue
        executor.prepare()  # untimed: placing the iteration's inputs, like a data loader
        try:
            sample = time_region(executor.device, driver.step())
        except torch.OutOfMemoryError as exc:
            raise ExecutionError(_out_of_memory(executor, exc)) from None
        if i >= measure.warmup:
            _record(timed, executor, sample)
    return timed


def _record(timed: _Timed, executor: Executor, sample: Any) -> None:
    """A timed iteration's sample, peaks, retries, slot counts and kernel times."""
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


def _profiled_iteration(executor: Executor, driver: EagerDriver) -> Any:
    """One more iteration, as the timed ones ran (replayed or eager), under the profiler:
    the device's busy time in it (`runtime.device_trace`). After the timed iterations, so
    that tracing does not touch their times."""
    from autotm_py.runtime.device_trace import profile_device

    executor.prepare()
    try:
        return profile_device(driver.step(), executor.device)
    except torch.OutOfMemoryError as exc:
        raise ExecutionError(_out_of_memory(executor, exc)) from None


def _run_notes(executor: Executor, driver: EagerDriver, timed: _Timed, cap: int | None,
               measure: Measure, not_placed: str | None) -> list[str]:
    notes = [f"cap = budget + {measure.cap_slack_bytes >> 20} MiB slack for library "
             "workspaces"] if cap is not None else []
    notes += driver.notes
    if not_placed is not None and executor.memory.arena is not None:
        notes.append(not_placed)
    queues = replay_work_queues_note() if driver.replayed else None
    if queues is not None:
        notes.append(queues)
    notes += executor.memory.notes(executor.graph, executor.plan)
    held = driver.capture_reserved
    if cap is not None and held is not None and held > cap:
        notes.append(f"the capture held {(held - cap) / 2**20:.0f} MiB more than the cap once "
                     "(its private pool beside the warm-up's blocks; allowance "
                     f"{CAPTURE_ALLOWANCE >> 20} MiB); the replays ran under the cap")
    return notes


def _result(executor: Executor, driver: EagerDriver, timed: _Timed, cap: int | None,
            measure: Measure, mode: RunMode, notes: list[str], activity: Any) -> RunResult:
    plan, memory = executor.plan, executor.memory
    return RunResult(
        device=str(executor.device), device_name=device_name(str(executor.device)),
        iterations=measure.iterations, warmup=measure.warmup,
        iteration_times_s=tuple(timed.times), median_s=statistics.median(timed.times),
        kernel_times_s=tuple(statistics.median(c) for c in zip(*timed.kernels, strict=True))
        if timed.kernels else None, peak_fast_bytes=timed.peak,
        modelled_peak_fast_bytes=plan.header.counts.get("fast_peak_bytes"),
        budget_bytes=plan.header.budget_bytes, cap_bytes=cap,
        predicted_time_s=plan.header.predicted_time_s, slow_pool_bytes=executor.pool.nbytes,
        strategy=plan.header.strategy, model_name=executor.graph.name, notes=tuple(notes),
        kernel_samples_s=tuple(tuple(s) for s in timed.kernels)
        if measure.per_iteration_kernel_times else None,
        host_median_s=statistics.median(timed.host_times),
        alloc_retries=timed.alloc_retries, reserved_peak_bytes=timed.reserved,
        arena_bytes=None if memory.arena is None else memory.arena.nbytes,
        copied_outputs=None if memory.slots is None else timed.copied,
        replayed=driver.replayed, capture_reserved_bytes=driver.capture_reserved,
        placed_outputs=None if memory.placed is None else timed.placed,
        device_busy_s=None if activity is None else activity.busy_s,
        device_span_s=None if activity is None else activity.span_s,
        device_kernel_s=None if activity is None else activity.kernel_s,
        mode=mode.to_dict())


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


def _out_of_memory(executor: Executor, exc: BaseException) -> str:
    where = f"{_oom_request(exc)} at {executor.where()}"
    if executor.memory.arena is not None:
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
    return f"tried to allocate {found.group(1)}" if found else str(exc).split(". ")[0].strip()


def run_steps(graph: TensorGraph, plan: Plan, *, steps: int = 3, device: str = "cpu",
              seed: int = 0, deterministic: bool = True, mode: RunMode | None = None,
              masters: Values | None = None) -> list[dict[int, torch.Tensor]]:
    """Execute `steps` iterations (untimed) and return each step's graph outputs on the CPU:
    the values to compare with `reference.train_steps` and with other plans. `mode.arena`: at
    the planned offsets; `mode.replay` (CUDA): the first step eager, the others replays of a
    CUDA graph captured after it (an `ExecutionError` if the capture fails);
    `mode.placed`: as for `execute` (uncapped)."""
    mode = mode or RunMode()
    plan.validate(graph)
    check_run(device, mode)
    if mode.places_outputs:
        install_placed(plan.header.budget_bytes, device, capped=False)
    _, executor, driver = new_executor(graph, plan, device, seed, deterministic, mode=mode,
                                       masters=masters)
    try:
        return [_step(executor, driver, step) for step in range(steps)]
    finally:
        executor.memory.fence(False)


def _step(executor: Executor, driver: EagerDriver, step: int) -> dict[int, torch.Tensor]:
    """Untimed step `step`: eager, or (a replay driver) the warm-up, then captured replays."""
    if isinstance(driver, ReplayDriver) and step == 0:
        driver.warm_up()
    elif isinstance(driver, ReplayDriver):
        if step == 1:
            failed = driver.capture()
            if failed is not None:
                raise ExecutionError(f"CUDA graph capture failed at {failed}")
        executor.prepare_replay()
        driver.replay()
    else:
        executor.prepare()
        executor.run()
    return {t: executor.value(t).detach().cpu().clone() for t in executor.graph.outputs}
