"""In-context GPU profiling: time every kernel inside real iterations of the whole graph.

A kernel timed alone (`torch_profiler.time_kernel`) is timed with an idle GPU: a small kernel's
time then includes the host's dispatch of it, and its inputs sit warm in L2. Inside an
iteration the GPU usually runs ahead of the host, so the same kernel costs less, and a sum of
isolated times overstates an iteration (by 1.7x for DenseNet-264 at batch 32 on an H100). When
the whole graph fits on the device, `profile_in_context` runs the all-fast plan through the
executor with a CUDA event between consecutive kernels and stores, per signature, the median,
10th and 90th percentile over every instance and timed iteration. The interval between two
events is what the kernel adds to the iteration where it stands, so the kernel times sum to the
measured iteration time. Recording an event costs the host a few microseconds per kernel; where
Python dispatch bounds the iteration (many small kernels: ResNet-200, DenseNet-264) that
stretches the instrumented iteration (DenseNet-264: 160 ms against 128 ms), so the same
iteration is also timed without events and the excess is taken off every kernel in equal
shares (`remove_event_overhead`). Workspace sizes measured in isolation are kept. Device times
(`device_s`: the GPU work a kernel launched, without launch gaps; the simulator's GPU clock)
come from a profiler run with every kernel in a range: `kernel_device_times` reads them and
`per_signature_median` makes entries of them. `profile_in_context` measures them in one more
iteration after the timed ones (since 2026-11-28; before, experiments/gpu/gpu_busy.py and
import_device_times.py added them by hand to the shipped entries of three models, and every
other model's replays were priced at eager in-context times: ResNet-50 b32's all-fast replay
predicted 30.3 ms for 19.0 measured). The entries are kept per graph (`context_key`):
`load_costs` prefers them for that graph and uses the isolated times for every other graph.
"""

from __future__ import annotations

import logging
import os
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from autotm_py.errors import ProfileError
from autotm_py.options import Measure
from autotm_py.profiling.cache import (
    MEASURED,
    ProfileEntry,
    now_iso,
    profile_path,
    user_profiles_dir,
    write_entries,
)
from autotm_py.profiling.fingerprint import current_fingerprint
from autotm_py.profiling.profile import cost_sources, load_costs, unique_kernels
from autotm_py.profiling.sources import all_fast, graph_batch, in_context_placement

if TYPE_CHECKING:
    from autotm_py.costs import KernelCosts
    from autotm_py.ir.graph import TensorGraph
    from autotm_py.plan import Plan

log = logging.getLogger(__name__)
PathLike = str | os.PathLike[str]


def profile_in_context(graph: TensorGraph, plan: Plan, *, device: str = "cuda",
                       profiles_dir: PathLike | None = None, iterations: int = 5,
                       warmup: int = 2) -> KernelCosts:
    """Measure every kernel inside `iterations` iterations of `plan` (the all-fast plan:
    `autotm_py.pipeline.profile_in_context` makes it); cache; return costs."""
    from autotm_py.runtime.execute import execute

    if not device.startswith("cuda"):
        raise ProfileError("--in-context needs --device cuda: on the CPU a kernel's time does "
                           "not depend on its neighbours, so `autotm profile` already measures it")
    fingerprint = current_fingerprint("cuda")
    plain = execute(graph, plan, device=device,
                    measure=Measure(iterations=iterations, warmup=warmup, capped=False))
    run = execute(graph, plan, device=device,
                  measure=Measure(iterations=iterations, warmup=warmup, capped=False,
                                  kernel_times=True, per_iteration_kernel_times=True))
    corrected, overhead = remove_event_overhead(run.kernel_samples_s or (), plain.median_s)
    device_s = per_signature_median(graph, measure_device_times(graph, plan, device))
    samples: dict[str, list[float]] = defaultdict(list)
    for per_kernel in corrected:
        for kernel, seconds in zip(graph.kernels, per_kernel, strict=True):
            samples[kernel.signature].append(seconds)
    sources = cost_sources("cuda", fingerprint, profiles_dir, None)
    entries = {k.signature: {in_context_placement(graph, k): replace(
        _entry(k, samples[k.signature], graph, sources), device_s=device_s.get(k.signature))}
        for k in unique_kernels(graph)}

    path = profile_path(user_profiles_dir(profiles_dir), fingerprint)
    write_entries(path, fingerprint, entries)
    log.info("%s: %d kernels timed in context over %d iterations (median %.3f ms, %.3f ms "
             "with events; %.2f us per event taken off; device times of %d signatures) into %s",
             graph.name, len(graph.kernels), iterations, plain.median_s * 1e3,
             run.median_s * 1e3, overhead * 1e6, len(device_s), path)
    costs = load_costs(graph, device="cuda", profiles_dir=profiles_dir)
    return replace(costs, summary={**costs.summary, "iteration_median_s": plain.median_s,
                                   "instrumented_median_s": run.median_s,
                                   "event_overhead_s": overhead, "iterations": iterations})


def measure_device_times(graph: TensorGraph, plan: Plan, device: str,
                         warmup: int = 2) -> list[float]:
    """Per kernel of `graph`, the device time of the GPU work it launched in one iteration
    of `plan` run with every kernel in a profiler range, after `warmup` plain ones (the
    ranges cost host time, so this iteration is not one of the timed ones)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from autotm_py.runtime.drivers import give_back
    from autotm_py.runtime.execute import new_executor

    dev, executor, _ = new_executor(graph, plan, device)
    try:
        for _ in range(warmup):
            executor.prepare()
            executor.run()
        executor.kernel_ranges = True
        executor.prepare()
        torch.cuda.synchronize(dev)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            executor.run()
            torch.cuda.synchronize(dev)
    finally:
        executor.release()
        give_back(executor.device)
    return kernel_device_times(prof.events(), len(graph.kernels))


# What torch's autograd engine runs on a GPU's behalf: on its own device thread, not under
# the range of the kernel that called `torch.autograd.grad` (the recurrent gradient kernels)
ENGINE_EVENT = "autograd::engine::evaluate_function"


def kernel_device_times(events, n_kernels: int) -> list[float]:
    """Seconds of device work under each kernel's range (host-side range events only: the
    device-side copy of a range spans the same work), plus the work autograd's engine ran for
    it on its device thread: a recurrent gradient kernel's backward (`kernels/recurrent.py`)
    is launched there, outside the range, while the kernel's thread waits in it (the H200's
    in-context profile of 2026-12-02 gave LSTMGrad 4.3 ms of device time for a 13.9 ms
    kernel: its recomputed forward only)."""
    from torch.autograd import DeviceType

    from autotm_py.runtime.executor import KERNEL_RANGE

    seconds = [0.0] * n_kernels
    ranges: list[tuple[float, float, int, int]] = []  # start, end, thread, kernel
    engine = []
    for event in events:
        if event.device_type != DeviceType.CPU:
            continue
        if event.name.startswith(KERNEL_RANGE):
            index = int(event.name[len(KERNEL_RANGE):])
            seconds[index] += _device_us(event) / 1e6
            ranges.append((event.time_range.start, event.time_range.end, event.thread, index))
        elif event.name.startswith(ENGINE_EVENT) and event.cpu_parent is None:
            engine.append(event)
    for event in engine:  # on another thread, inside a kernel's range in time
        at = event.time_range.start
        for start, end, thread, index in ranges:
            if thread != event.thread and start <= at <= end:
                seconds[index] += _device_us(event) / 1e6
                break
    return seconds


def _device_us(event) -> float:
    total = getattr(event, "device_time_total", None)  # torch < 2.4: cuda_time_total
    return event.cuda_time_total if total is None else total


def per_signature_median(graph: TensorGraph, per_kernel: Sequence[float]) -> dict[str, float]:
    """The median over each signature's instances (empty input: nothing known)."""
    if not per_kernel:
        return {}
    by_signature: dict[str, list[float]] = defaultdict(list)
    for kernel, seconds in zip(graph.kernels, per_kernel, strict=True):
        by_signature[kernel.signature].append(seconds)
    return {sig: float(np.median(v)) for sig, v in by_signature.items() if max(v) > 0}


# A kernel keeps at least this share of its instrumented time: the overhead is taken evenly,
# but a long kernel that the host was ahead of did not pay it.
MIN_KEPT_SHARE = 0.5


def remove_event_overhead(samples: Sequence[Sequence[float]], plain_iteration_s: float
                          ) -> tuple[list[list[float]], float]:
    """Per iteration, take what the events added (instrumented sum - `plain_iteration_s`)
    off every kernel in equal shares; returns the corrected samples and the mean share."""
    corrected: list[list[float]] = []
    shares: list[float] = []
    for times in samples:
        share = max(sum(times) - plain_iteration_s, 0.0) / max(len(times), 1)
        shares.append(share)
        corrected.append([max(t - share, t * MIN_KEPT_SHARE) for t in times])
    return corrected, (sum(shares) / len(shares) if shares else 0.0)


def _entry(kernel, times: list[float], graph: TensorGraph, sources) -> ProfileEntry:
    p10, median, p90 = np.percentile(np.asarray(times), [10, 50, 90])
    isolated = sources.exact(kernel.signature, all_fast(kernel))
    workspace = isolated.workspace_bytes if isolated is not None else None
    return ProfileEntry(float(median), float(p10), float(p90), len(times), MEASURED, now_iso(),
                        graph_batch(graph), kernel.op_type, None, workspace,
                        context=context_key(graph))


def context_key(graph: TensorGraph) -> str:
    """In-context times belong to the graph they were measured in: the same signature costs
    what its neighbours let it cost, so entries are stored per graph, under the placement
    key ``"<placement>@<model hash>"`` beside the isolated ``"<placement>"`` entry."""
    return graph.model_hash
