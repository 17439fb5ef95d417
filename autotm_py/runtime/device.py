"""Device plumbing shared by the executor, the eager baselines, profiling and the experiments:
checking and naming a device, configuring CUDA, capping the caching allocator at a budget, and
timing one region of work. torch is imported by this module.
"""

from __future__ import annotations

import gc
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from autotm_py.errors import ConfigError
from autotm_py.options import DEFAULT_ALLOCATOR_SETTINGS
from autotm_py.runtime import placed
from autotm_py.units import format_bytes

# The hardware work queues a CUDA context spreads its streams over (CUDA's default is 8). With
# 8, a plan replayed as a CUDA graph copies 9-14% slower than the same plan run eagerly (every
# copy alike, whatever its size, alignment or the graph's internal stream; torch profiler, an
# H200 and H100s); with 1 its copies run at their eager speed and copy-bound plans 6-7% faster
# (docs/gpu.md, "Copies in a replay: the work queues"). Eager runs need several: with one, the
# copy streams queue behind the compute stream (a move-only plan ran 327 ms eagerly instead of
# 255). The driver reads the variable when the process first uses CUDA.
WORK_QUEUES_VARIABLE = "CUDA_DEVICE_MAX_CONNECTIONS"
REPLAY_WORK_QUEUES = "1"


def check_device(device: str) -> str:
    """`device` when torch can use it here, else a `ConfigError` that says what to use."""
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(f"--device {device}: no CUDA GPU is visible to torch here; use "
                              "--device cpu to check the plan's results on the CPU")
        return device
    if device != "cpu":
        raise ConfigError(f"--device {device!r}: choose cuda or cpu")
    return device


def gpu_room_bytes(device: str) -> int:
    """The GPU memory a plan run in this process may take: under the placed allocator its
    region (reserved at the first allocation as the free memory less `placed.REGION_SPARE`),
    else the free memory and what torch's caching allocator holds unused."""
    lib = placed.active()
    region = lib.stats().region_bytes if lib is not None else 0
    if region:
        return region
    free, _ = torch.cuda.mem_get_info(torch.device(device))
    if lib is not None:
        return max(free - placed.REGION_SPARE, 0)
    index = cuda_index(device)
    return free + torch.cuda.memory_reserved(index) - torch.cuda.memory_allocated(index)


def check_budget_room(budget: int | None, device: str, what: str | None) -> None:
    """A `ConfigError` naming `what` (None: the caller names itself, as the Trainer's errors
    do) where a plan's `budget` (bytes) exceeds the GPU memory it may take here
    (`gpu_room_bytes`): its arena could not be placed (an 80 GiB budget on an H100 80GB failed
    at its first copy with CUDA's "invalid argument")."""
    if budget is None or not device.startswith("cuda"):
        return
    room = gpu_room_bytes(device)
    if budget > room:
        raise ConfigError(
            f"{what + ': ' if what else ''}the budget {format_bytes(budget)} is more than the "
            f"{format_bytes(room)} of GPU memory a plan may take on this {device_name(device)} "
            f"(its free memory less CUDA's and cuBLAS's own); give a budget of at most "
            f"{format_bytes(room)}")


def device_name(device: str) -> str:
    """The GPU's name for a CUDA device, else the CPU's."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return platform.processor() or platform.machine()


def cuda_index(device: str | torch.device) -> int:
    dev = torch.device(device)
    return dev.index if dev.index is not None else torch.cuda.current_device()


def configure_cuda(deterministic: bool,
                   allocator_settings: str | None = DEFAULT_ALLOCATOR_SETTINGS) -> None:
    """Allocator settings (None: leave the environment's `PYTORCH_CUDA_ALLOC_CONF`), and
    deterministic algorithms, which make two plans' results bitwise equal on the GPU."""
    if allocator_settings is not None:
        set_allocator_settings(allocator_settings)
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False


def use_replay_work_queues() -> str | None:
    """One hardware work queue for this process (`REPLAY_WORK_QUEUES`), which will replay plans
    as CUDA graphs, unless the environment chose a number. Only before the process first uses
    CUDA: afterwards it returns `replay_work_queues_note()` instead."""
    if WORK_QUEUES_VARIABLE in os.environ:
        return None
    if torch.cuda.is_initialized():
        return replay_work_queues_note()
    os.environ[WORK_QUEUES_VARIABLE] = REPLAY_WORK_QUEUES
    return None


def replay_work_queues_note() -> str | None:
    """What a replay says when its process runs with more than one work queue (None if not)."""
    value = os.environ.get(WORK_QUEUES_VARIABLE)
    if value == REPLAY_WORK_QUEUES:
        return None
    now = f"is {value}" if value is not None else "was unset (8 work queues) when CUDA started"
    return (f"{WORK_QUEUES_VARIABLE} {now} in this process: a replay's copies run up to 14% "
            f"slower than with {REPLAY_WORK_QUEUES}, which `autotm run --graph` sets before "
            "CUDA starts (from Python: `prepare_cuda_process` first; docs/gpu.md)")


def eager_work_queues_note() -> str:
    """What an eager run in a process set up for replays adds to its notes ('' if nothing):
    with one work queue its copy streams queue behind the compute stream."""
    if os.environ.get(WORK_QUEUES_VARIABLE) != REPLAY_WORK_QUEUES:
        return ""
    return (f" with one work queue ({WORK_QUEUES_VARIABLE}={REPLAY_WORK_QUEUES}, set for the "
            "replay), at which its copies overlap kernels less than eager runs usually do")


def set_allocator_settings(settings: str) -> None:
    # torch >= 2.11 moved the setter to the accelerator API and deprecated the CUDA one.
    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
    if setter is None:
        setter = torch.cuda.memory._set_allocator_settings
    setter(settings)


def apply_cap(budget: int | None, device: str, enforce: bool, slack: int) -> int | None:
    """Cap the caching allocator at budget + slack, so a plan that claims to fit really fits;
    returns the cap (None: no cap). Undo it with `release_cap`."""
    if not enforce or budget is None or not device.startswith("cuda"):
        return None
    # Blocks cached by an earlier run in this process would serve allocations without ever
    # meeting the cap (it bounds new segments), hiding this plan's fragmentation: start empty.
    # An earlier run's arena or CUDA graph (its private pool) left in a reference cycle would
    # hold its memory until the collector ran, and count against this run's cap: collect first.
    gc.collect()
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    return set_cap(device, budget + slack)


def set_cap(device: str | torch.device, nbytes: int) -> int:
    """Cap the caching allocator of `device` at `nbytes` (at most the device's memory); returns
    the cap."""
    index = cuda_index(device)
    total = torch.cuda.get_device_properties(index).total_memory
    cap = min(nbytes, total)
    torch.cuda.set_per_process_memory_fraction(cap / total, index)
    return cap


def release_cap(device: str) -> None:
    torch.cuda.set_per_process_memory_fraction(1.0, cuda_index(device))


def release_blas_workspaces(device: str | torch.device) -> None:
    """Free the cuBLAS and cuBLASLt workspaces torch keeps for every stream that ran a matmul
    (about 33 MiB each on the H100, never freed by `empty_cache`). The runtime reserve counts
    one stream's; an earlier run's streams, or the eager warm-up's stream once a graph is
    captured on another, would hold theirs under this run's cap (the BERT-base arena plans ran
    out of memory by 18 MiB with three of them live: experiments/journal/gpu-2026-11.md)."""
    torch.cuda.synchronize(device)
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:  # torch's own call (torch.cuda.graphs-era API); absent: they stay
        clear()
    torch.cuda.empty_cache()


def prime_blas_workspaces(device: str | torch.device) -> None:
    """Only the current stream's cuBLAS workspaces, made now: allocated before an arena they
    sit below it, not among the kernels' scratch above it, where a long-lived block would keep
    the pages around it from being returned (expandable segments map whole pages)."""
    release_blas_workspaces(device)
    a = torch.ones(8, 8, device=device)
    torch.addmm(torch.ones(8, device=device), a, a)  # the cuBLASLt path (bias epilogue)
    torch.mm(a, a)  # the cuBLAS one
    torch.cuda.synchronize(device)


def alloc_retries(device: torch.device) -> int:
    """Times the caching allocator met the cap, released its cache and retried (so far);
    under the placed allocator, requests its region (the cap) could not serve."""
    lib = placed.active()
    if lib is not None:
        return lib.stats().overflow_allocations
    return int(torch.cuda.memory_stats(device).get("num_alloc_retries", 0))


def reset_peaks(device: torch.device | str) -> None:
    """Start the peaks of `peaks` afresh (torch's, or the placed allocator's: torch keeps no
    statistics under a pluggable allocator)."""
    lib = placed.active()
    if lib is not None:
        lib.reset_peaks()
    else:
        torch.cuda.reset_peak_memory_stats(device)


def allocated(device: torch.device | str) -> int:
    """Bytes allocated now (torch's caching allocator's, or the placed allocator's in use)."""
    lib = placed.active()
    if lib is not None:
        return lib.stats().in_use_bytes
    return int(torch.cuda.memory_allocated(device))


def peaks(device: torch.device | str) -> tuple[int, int]:
    """(allocated, reserved) peaks since `reset_peaks`: torch's caching allocator's, or under
    the placed allocator its bytes in use and the extent of its region in use (plus what
    overflowed it)."""
    lib = placed.active()
    if lib is not None:
        s = lib.stats()
        return s.peak_in_use_bytes, s.peak_extent_bytes + s.overflow_bytes
    return int(torch.cuda.max_memory_allocated(device)), int(torch.cuda.max_memory_reserved(device))


@dataclass(frozen=True)
class Sample:
    """One measured run of a piece of work (`time_region`)."""

    seconds: float  # wall time on the CPU; CUDA events on the current stream on a GPU
    host_seconds: float  # how long the host took to enqueue it
    peak: int | None  # CUDA: max_memory_allocated during it
    retries: int  # CUDA: allocator retries during it
    reserved: int | None = None  # CUDA: max_memory_reserved during it (blocks and cache)


def time_region(device: torch.device, body: Callable[[], object]) -> Sample:
    """Run `body` once and measure it. On a GPU the device is synchronized first, so the
    events, the peak and the retries cover `body` alone."""
    if device.type != "cuda":
        begin = time.perf_counter()
        body()
        seconds = time.perf_counter() - begin
        return Sample(seconds, seconds, None, 0)
    torch.cuda.synchronize(device)
    reset_peaks(device)
    retries = alloc_retries(device)
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    host_begin = time.perf_counter()
    body()
    host_seconds = time.perf_counter() - host_begin
    end.record()
    torch.cuda.synchronize(device)
    allocated, reserved = peaks(device)
    return Sample(begin.elapsed_time(end) / 1e3, host_seconds, allocated,
                  alloc_retries(device) - retries, reserved)
