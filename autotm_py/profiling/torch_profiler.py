"""Time one kernel with torch on the real device, and measure a device's roofline.

Inputs are random tensors of the kernel's shapes and dtypes, allocated on the device; integer
inputs (Gather indices, class labels) are drawn inside the range that the op indexes, and graph
constants keep their values. The kernel runs through `kernels.run_kernel`, the same
implementation the executor uses. Warm-up runs are excluded; the median and the 10th/90th
percentiles of the timed runs are kept. CPU runs are timed with `time.perf_counter`; CUDA runs
with a pair of CUDA events around each run.
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from autotm_py.ir.builder import GraphBuilder
from autotm_py.ir.graph import Role
from autotm_py.profiling.costmodel import Roofline

if TYPE_CHECKING:
    import torch

    from autotm_py.ir.graph import Kernel, TensorGraph

log = logging.getLogger(__name__)

Runner = Callable[["Kernel", Sequence["torch.Tensor"]], Any]

# Ops whose integer input indexes a dimension of another slot: op -> (slot of the indexed
# tensor in inputs + outputs, its axis attribute, the axis when the attribute is absent).
INDEXED_SLOT: dict[str, tuple[int, str, int]] = {
    "Gather": (0, "axis", 0),
    "GatherGrad": (2, "axis", 0),  # dY, indices -> dData
    "SoftmaxCrossEntropyLoss": (0, "", 1),  # scores [N, C, ...]: classes on axis 1
    "SoftmaxCrossEntropy": (0, "axis", -1),
    "SoftmaxCrossEntropyGrad": (0, "axis", -1),
}


# Fractions of the measured peaks (compute, memory) that ordinary kernels reach, fitted per
# device kind to the shipped zoo profiles (docs/profiling.md): a large matmul and a large
# copy are the best case.
MEASURED_EFFICIENCY = {"cuda": (0.5, 0.7), "cpu": (0.7, 0.8)}


@dataclass(frozen=True)
class Timing:
    """Median and spread of timed runs, in seconds; on CUDA also the kernel's device time
    (`graph_device_time`), None where it could not be captured."""

    median_s: float
    p10_s: float
    p90_s: float
    runs: int
    device_s: float | None = None

    @classmethod
    def of(cls, samples: Sequence[float], device_s: float | None = None) -> Timing:
        arr = np.asarray(samples, dtype=np.float64)
        p10, med, p90 = np.percentile(arr, [10, 50, 90])
        return cls(float(med), float(p10), float(p90), len(arr), device_s)


def default_runner() -> Runner:
    """`kernels.run_kernel`, imported when first needed (it imports torch)."""
    from autotm_py.kernels import run_kernel

    return run_kernel


def torch_dtype(name: str) -> torch.dtype:
    import torch

    return getattr(torch, name)  # type: ignore[no-any-return]


# ---- inputs ------------------------------------------------------------------------------------
def index_bound(graph: TensorGraph, kernel: Kernel, slot: int) -> int:
    """An exclusive upper bound for the integer input in `slot` that keeps every index valid.

    Known ops index one dimension of a known slot (INDEXED_SLOT). Otherwise the smallest
    dimension of the kernel's float operands bounds it: always in range, if not realistic.
    """
    shapes = [graph.tensors[t].shape for t in kernel.io]
    known = INDEXED_SLOT.get(kernel.op_type)
    if known is not None:
        target, axis_name, default = known
        shape = shapes[target]
        value = kernel.attr(axis_name) if axis_name else None
        axis = default if value is None else int(value)
        if shape:
            return max(int(shape[axis % len(shape)]), 1)
    float_dims = [d for t, s in zip(kernel.io, shapes, strict=True)
                  if graph.tensors[t].dtype.startswith(("float", "bfloat")) for d in s]
    return max(min(float_dims, default=1), 1)


def make_inputs(graph: TensorGraph, kernel: Kernel, device: str,
                seed: int = 0) -> list[torch.Tensor]:
    """Random tensors for the kernel's inputs, on `device`, with valid integer values, stored
    as the graph stores them (channels-last images: `ir.layout`)."""
    import torch

    from autotm_py.kernels.util import in_layout

    gen = torch.Generator(device=device).manual_seed(seed)
    args = []
    for slot, tid in enumerate(kernel.inputs):
        t = graph.tensors[tid]
        if tid in graph.constants:
            args.append(torch.as_tensor(np.array(graph.constants[tid])).to(device))
            continue
        dtype = torch_dtype(t.dtype)
        if t.dtype == "bool":
            value = torch.rand(t.shape, generator=gen, device=device) < 0.5
        elif dtype.is_floating_point:
            # in [0.5, 1.5): no zeros, no negatives, so Log/Sqrt/Div/Pow stay finite
            value = (torch.rand(t.shape, generator=gen, device=device) + 0.5).to(dtype)
        else:
            high = index_bound(graph, kernel, slot)
            value = torch.randint(0, high, t.shape, generator=gen, device=device, dtype=dtype)
        args.append(in_layout(value, t))
    return args


# ---- timing ------------------------------------------------------------------------------------
def _wall(fn: Callable[[], Any], sync: Callable[[], None]) -> float:
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def _plan_runs(first_s: float, repeats: int, budget_s: float, min_runs: int) -> int:
    """Timed runs to do: `repeats`, fewer when they would take longer than `budget_s`."""
    if first_s <= 0:
        return repeats
    return max(min(repeats, int(budget_s / first_s)), min(min_runs, repeats))


def time_kernel(kernel: Kernel, args: Sequence[torch.Tensor], *, device: str = "cpu",
                runner: Runner | None = None, repeats: int = 10, warmup: int = 2,
                budget_s: float = 2.0, min_runs: int = 3) -> Timing:
    """Time `runner(kernel, args)`: `warmup` untimed runs, then up to `repeats` timed ones;
    on CUDA also its device time (`graph_device_time`)."""
    import torch

    run = runner or default_runner()
    cuda = device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    first = _wall(lambda: run(kernel, args), sync)  # also the first warm-up run
    for _ in range(max(warmup - 1, 0)):
        run(kernel, args)
    n = _plan_runs(first, repeats, budget_s, min_runs)
    if not cuda:
        return Timing.of(_cpu_samples(kernel, args, run, n))
    samples = _cuda_samples(kernel, args, run, n)
    return Timing.of(samples, graph_device_time(kernel, args, run, float(np.median(samples)), n))


# A kernel's device time is timed over replays of a CUDA graph of several runs of it, enough to
# keep the GPU busy this long a replay: the latency of a graph's start on the GPU, a few
# microseconds, is then a small share of it (a replayed plan pays `costs.REPLAY_GAP_S` between
# nodes).
DEVICE_TIME_GRAPH_S = 200e-6
DEVICE_TIME_MAX_RUNS = 16


def graph_device_time(kernel: Kernel, args: Sequence[torch.Tensor], run: Runner,
                      eager_s: float, replays: int) -> float | None:
    """The GPU time of one run of the kernel without launch gaps, as a replayed plan pays it
    (`ProfileEntry.device_s`, the simulator's GPU clock): the run captured in a CUDA graph
    (the executor's own capture, `runtime.drivers.GraphReplay`) up to DEVICE_TIME_MAX_RUNS
    times, the graph replayed `replays` times, the median replay over its runs. Timed alone,
    a small kernel's `median_s` is mostly the host's dispatch of it: bf16 plans priced so were
    predicted 11-76% high on the H200 (2026-12-03), where the fp32 plans' shipped in-context
    device times kept them within 5%. None where the kernel cannot be captured (it
    synchronises with the host): a replayed plan runs such a kernel eagerly too."""
    import torch

    from autotm_py.runtime.drivers import GraphReplay

    runs = int(min(max(DEVICE_TIME_GRAPH_S // max(eager_s, 1e-9), 1), DEVICE_TIME_MAX_RUNS))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # the eager run a capture needs on its stream
        run(kernel, args)

    def body() -> None:
        for _ in range(runs):
            run(kernel, args)

    with warnings.catch_warnings():  # a view launches nothing: its graph is empty, and free
        warnings.filterwarnings("ignore", message="The CUDA Graph is empty")
        capture = GraphReplay(body, lambda: kernel.name, stream)
    if capture.failed is not None:
        return None
    # each replay timed between its own events, the median kept: a replay the host launched
    # late (as beside other processes' work: a fresh H100's profile taken so priced
    # ResNet-200's kernels 11% high, 2026-12-07) is one slow sample, not a share of the total
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(max(replays, 1))]
    with torch.cuda.stream(stream):
        capture.replay()  # the first replay uploads the graph
        for start, end in events:
            start.record()
            capture.replay()
            end.record()
    events[-1][1].synchronize()
    torch.cuda.current_stream().wait_stream(stream)
    return float(np.median([start.elapsed_time(end) for start, end in events])) / 1e3 / runs


def measure_workspace(kernel: Kernel, args: Sequence[torch.Tensor], *, device: str,
                      runner: Runner | None = None) -> int | None:
    """CUDA: bytes the kernel allocates beyond its inputs and outputs while it runs (library
    workspaces, temporaries): peak allocated during one run minus what is allocated after it,
    when the outputs are still held. None on the CPU (host-mode budgets count tensors only)."""
    if not device.startswith("cuda"):
        return None
    import torch

    # torch's statistics, or the placed allocator's where it is torch's (a Trainer's process)
    from autotm_py.runtime.device import allocated, peaks, reset_peaks

    run = runner or default_runner()
    torch.cuda.synchronize()
    reset_peaks(device)
    outputs = run(kernel, args)
    torch.cuda.synchronize()
    workspace = peaks(device)[0] - allocated(device)
    del outputs
    return max(int(workspace), 0)


def _cpu_samples(kernel: Kernel, args: Sequence[torch.Tensor], run: Runner,
                 n: int) -> list[float]:
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        run(kernel, args)
        samples.append(time.perf_counter() - start)
    return samples


def _cuda_samples(kernel: Kernel, args: Sequence[torch.Tensor], run: Runner,
                  n: int) -> list[float]:
    import torch

    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(n)]
    torch.cuda.synchronize()
    for start, end in events:
        start.record()
        run(kernel, args)
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) / 1e3 for start, end in events]


# ---- the device roofline -----------------------------------------------------------------------
def _best_of(fn: Callable[[], Any], sync: Callable[[], None], runs: int) -> float:
    fn()  # warm-up
    return min(_wall(fn, sync) for _ in range(runs))


def measure_roofline(device: str, name: str, runner: Runner | None = None) -> Roofline:
    """Peak FLOP/s (a large matmul per dtype), memory bandwidth (a large copy, bytes read plus
    written) and the per-kernel cost (a 1-element Relu through `runner`, the path every
    profiled kernel takes) of `device`, as run by torch now."""
    import torch

    cuda = device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    n, copy_bytes = (8192, 1 << 30) if cuda else (1536, 1 << 28)
    peaks: dict[str, float] = {}
    for dtype in ("float32", "bfloat16"):
        a = torch.rand(n, n, device=device).to(torch_dtype(dtype))
        b = torch.rand(n, n, device=device).to(torch_dtype(dtype))
        peaks[dtype] = 2.0 * n**3 / _best_of(lambda a=a, b=b: a @ b, sync, 3)
    peaks["float16"] = peaks["bfloat16"]
    if cuda:  # fp32 convolutions run on TF32 tensor cores by cuDNN's default
        peaks["tf32"] = _tf32_peak(n, device, sync)
    bw = _copy_rate(copy_bytes, device, sync)
    cache_bytes = _cache_bytes(device)
    # a copy whose source and destination fill half the cache: the in-cache streaming rate
    cache_bw = _copy_rate(cache_bytes // 4, device, sync, runs=20) if cache_bytes else None
    if cache_bw is not None and cache_bw <= bw:
        # a GPU's in-L2 copy is too short to reach even the HBM rate: no faster level to model
        cache_bw = None
    launch = _dispatch_cost(device, runner or default_runner(), sync)
    when = time.strftime("%Y-%m-%d")
    compute_eff, memory_eff = MEASURED_EFFICIENCY["cuda" if cuda else "cpu"]
    return Roofline(name=name, peak_flops=peaks, mem_bw=bw, launch_s=launch,
                    compute_eff=compute_eff, memory_eff=memory_eff, conv_tf32=cuda,
                    source=f"measured by torch {torch.__version__} on {name}, {when}",
                    cache_bw=cache_bw, cache_bytes=cache_bytes,
                    extra={"threads": torch.get_num_threads(), "matmul_n": n,
                           "copy_bytes": copy_bytes, "loadavg_1min": loadavg()})


def _copy_rate(nbytes: int, device: str, sync: Callable[[], None], runs: int = 3) -> float:
    """Bytes read plus written per second by a copy of `nbytes`."""
    import torch

    src = torch.empty(max(nbytes // 4, 1), device=device)
    dst = torch.empty_like(src)
    return 2.0 * nbytes / _best_of(lambda: dst.copy_(src), sync, runs)


def _cache_bytes(device: str) -> int:
    """The last-level cache: the GPU's L2, or the CPU's largest cache level (Linux sysfs)."""
    import torch

    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return int(getattr(props, "L2_cache_size", 0) or 0)
    sizes = []
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = path.read_text().strip().upper()
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes, default=0)


def loadavg() -> float | None:
    """The 1-minute load average when measured: other work on a shared machine skews CPU
    profiles, so it is recorded beside them."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def _tf32_peak(n: int, device: str, sync: Callable[[], None]) -> float:
    import torch

    a = torch.rand(n, n, device=device)
    allowed = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        return 2.0 * n**3 / _best_of(lambda: a @ a, sync, 3)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = allowed


def _dispatch_cost(device: str, runner: Runner, sync: Callable[[], None]) -> float:
    """Seconds of a kernel that does (almost) nothing: the fixed cost of every kernel."""
    import torch

    b = GraphBuilder("dispatch")
    x = b.add_tensor("x", (1,), "float32", Role.INPUT)
    y = b.add_tensor("y", (1,), "float32", Role.OUTPUT)
    b.add_kernel("Relu", [x], [y])
    kernel = b.build().kernels[0]
    args = [torch.ones(1, device=device)]
    return _mean_small(lambda: runner(kernel, args), sync)


def _mean_small(fn: Callable[[], Any], sync: Callable[[], None], runs: int = 200) -> float:
    for _ in range(20):
        fn()
    sync()
    start = time.perf_counter()
    for _ in range(runs):
        fn()
    sync()
    return (time.perf_counter() - start) / runs
