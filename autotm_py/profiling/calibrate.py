"""`autotm calibrate`: measure the host<->GPU link and write a GPU-mode `MemorySystem`.

Measured with torch on one CUDA device (`measure_tables`), every copy timed by CUDA events:
- pinned and pageable host->device and device->host copies over sizes (1 MiB .. 1 GiB);
- both directions at once (two copy streams), total bytes over the longer of the two;
- copies while matrix products run on another stream (interference): each direction alone
  and both at once under compute, and how much the compute slows down;
- a device-to-device copy (the HBM rate, bytes read plus written);
- the cost of allocating pinned host memory (`torch.empty(pin_memory=True)`) by size, first
  allocation and reuse through torch's caching host allocator.

`summarize` (pure, unit-tested on CPU) fits the tables into a `MemorySystem` with the model
time = latency + bytes / bandwidth (`fit_link`: bandwidth from the sizes >= 64 MiB, latency from
all sizes); asynchronous rates are one direction's rate under compute (both directions at once
are `both_directions_bw`), and the raw tables stay in `measured`.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from autotm_py.errors import ConfigError, ProfileError
from autotm_py.memory.tiers import Link, MemorySystem, TierSpec, preset
from autotm_py.profiling.progress import ProgressCallback, progress_reporter

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

MiB = 1 << 20
DEFAULT_SIZES: tuple[int, ...] = tuple(MiB << s for s in range(0, 11, 2))  # 1 MiB .. 1 GiB
LARGE = 64 * MiB  # sizes from here on give the steady-state bandwidth
COPY_KINDS = ("h2d_pinned", "d2h_pinned", "h2d_pageable", "d2h_pageable", "both_pinned",
              "d2d")
# bytes moved per copied byte: both directions move the size twice; a device-to-device copy
# reads and writes it (the HBM traffic rate)
TRAFFIC = {"both_pinned": 2, "d2d": 2}

Table = list[dict[str, float]]  # rows of {"bytes": n, "seconds": median, "gbps": ...}


# ---- fitting (pure) ----------------------------------------------------------------------------
def fit_link(rows: Sequence[Mapping[str, float]], large: int = LARGE) -> tuple[float, float]:
    """(bandwidth bytes/s, latency s) of a copy table, for the model t = latency + bytes/bw.

    The bandwidth is the inverse slope of a least-squares line through the sizes >= `large`
    (steady-state copies, where a fixed cost no longer biases the rate), or the best rate when
    fewer than two sizes are that large. The latency is the median, over the sizes below
    `large` (all sizes if none), of the time the bandwidth does not explain, clamped at zero:
    at large sizes that remainder is mostly noise of the bandwidth.
    """
    if not rows:
        raise ProfileError("calibration table is empty: nothing to fit")
    big = [r for r in rows if r["bytes"] >= large]
    bandwidth = max(r["bytes"] / r["seconds"] for r in rows)
    if len(big) >= 2:
        slope, _ = statistics.linear_regression([float(r["bytes"]) for r in big],
                                                [float(r["seconds"]) for r in big])
        if slope > 0:
            bandwidth = 1.0 / slope
    small = [r for r in rows if r["bytes"] < large] or list(rows)
    latency = statistics.median(r["seconds"] - r["bytes"] / bandwidth for r in small)
    return bandwidth, max(latency, 0.0)


def _rate(tables: Mapping[str, Any], key: str, fallback: float) -> float:
    rows = tables.get(key) or []
    return fit_link(rows)[0] if rows else fallback


def summarize(tables: Mapping[str, Any], *, device_name: str, date: str,
              versions: Mapping[str, str] | None = None) -> MemorySystem:
    """A GPU-mode memory system from measured tables (see the module docstring)."""
    for key in ("h2d_pinned", "d2h_pinned"):
        if not tables.get(key):
            raise ProfileError(f"calibration tables lack {key!r}; re-run `autotm calibrate`")
    read_bw, read_lat = fit_link(tables["h2d_pinned"])
    write_bw, write_lat = fit_link(tables["d2h_pinned"])
    under = tables.get("under_compute", {})
    async_read = float(under.get("h2d_gbps", read_bw / 1e9)) * 1e9
    async_write = float(under.get("d2h_gbps", write_bw / 1e9)) * 1e9
    both = _rate(tables, "both_pinned", 0.0) or None
    hbm = _rate(tables, "d2d", 0.0) or 3.0e12
    slug = "".join(c if c.isalnum() else "-" for c in device_name.lower()).strip("-")
    return MemorySystem(
        name=f"calibrated-{slug}",
        mode="gpu",
        fast=TierSpec("hbm", read_bw=hbm, write_bw=hbm, latency_s=0.0),
        slow=TierSpec("pinned-host", read_bw=read_bw, write_bw=write_bw,
                      latency_s=max(read_lat, write_lat)),
        link=Link(read_bw=read_bw, write_bw=write_bw, async_read_bw=async_read,
                  async_write_bw=async_write, latency_s=(read_lat + write_lat) / 2,
                  both_directions_bw=both),
        source=f"autotm calibrate on {device_name}, {date}",
        measured={"device": device_name, "date": date, **dict(versions or {}),
                  "tables": dict(tables)},
        # torch's cuBLAS workspaces: the runtime's, not the link's; the GPU preset's measured
        # value (docs/memory-systems.md, "The runtime reserve"), so plans stay within the cap
        runtime_reserve_bytes=preset("h100-pcie5").runtime_reserve_bytes,
    )


def row(nbytes: int, samples: Sequence[float]) -> dict[str, float]:
    """One table row: median seconds of the samples and the rate it gives."""
    seconds = statistics.median(samples)
    return {"bytes": nbytes, "seconds": seconds, "gbps": nbytes / seconds / 1e9,
            "min_s": min(samples), "max_s": max(samples), "runs": len(samples)}


# ---- measuring (CUDA) --------------------------------------------------------------------------
def _timed(fn: Callable[[], Any], stream: torch.cuda.Stream) -> float:
    """Seconds of `fn` enqueued on `stream`, by CUDA events."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        start.record(stream)
        fn()
        end.record(stream)
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def _buffers(nbytes: int, device: str) -> dict[str, torch.Tensor]:
    import torch

    return {"pinned": torch.empty(nbytes, dtype=torch.uint8, pin_memory=True),
            "pinned2": torch.empty(nbytes, dtype=torch.uint8, pin_memory=True),
            "pageable": torch.empty(nbytes, dtype=torch.uint8),
            "dev": torch.empty(nbytes, dtype=torch.uint8, device=device),
            "dev2": torch.empty(nbytes, dtype=torch.uint8, device=device)}


def _copy_samples(buf: Mapping[str, torch.Tensor], repeats: int,
                  streams: Sequence[torch.cuda.Stream]) -> dict[str, list[float]]:
    """Seconds per repeat of each copy kind for one size (after one warm-up each)."""
    h2d, d2h = streams[0], streams[1]
    copies: dict[str, tuple[Callable[[], Any], torch.cuda.Stream]] = {
        "h2d_pinned": (lambda: buf["dev"].copy_(buf["pinned"], non_blocking=True), h2d),
        "d2h_pinned": (lambda: buf["pinned"].copy_(buf["dev"], non_blocking=True), d2h),
        "h2d_pageable": (lambda: buf["dev"].copy_(buf["pageable"], non_blocking=True), h2d),
        "d2h_pageable": (lambda: buf["pageable"].copy_(buf["dev"], non_blocking=True), d2h),
        "d2d": (lambda: buf["dev2"].copy_(buf["dev"]), h2d),
    }
    out: dict[str, list[float]] = {}
    for name, (fn, stream) in copies.items():
        _timed(fn, stream)
        out[name] = [_timed(fn, stream) for _ in range(repeats)]
    # both directions at once, on their own buffers: from the common start to the later end
    both = [(lambda: buf["dev"].copy_(buf["pinned"], non_blocking=True), h2d),
            (lambda: buf["pinned2"].copy_(buf["dev2"], non_blocking=True), d2h)]
    out["both_pinned"] = [max(_concurrent(both)) for _ in range(repeats + 1)][1:]
    return out


def measure_tables(device: str = "cuda", *, sizes: Sequence[int] = DEFAULT_SIZES,
                   repeats: int = 5, report: ProgressCallback | None = None) -> dict[str, Any]:
    """Every table of the module docstring, measured on `device` now."""
    import torch

    streams = [torch.cuda.Stream(device=device) for _ in range(3)]
    tables: dict[str, Any] = {k: [] for k in COPY_KINDS}
    steps = len(sizes) + 2
    for i, nbytes in enumerate(sizes):
        if report:
            report(i, steps, f"copies of {nbytes // MiB} MiB")
        buf = _buffers(nbytes, device)
        for name, samples in _copy_samples(buf, repeats, streams).items():
            tables[name].append(row(nbytes * TRAFFIC.get(name, 1), samples))
        del buf
    if report:
        report(len(sizes), steps, "copies under compute")
    tables["under_compute"] = measure_interference(device, min(max(sizes), 256 * MiB), streams)
    if report:
        report(len(sizes) + 1, steps, "pinned allocation")
    tables["pin_alloc"] = measure_pin_alloc(sizes, repeats)
    if report:
        report(steps, steps, "done")
    return tables


def _concurrent(jobs: Sequence[tuple[Callable[[], Any], torch.cuda.Stream]]) -> list[float]:
    """Start every job at one event on its own stream; seconds from the start to each end."""
    import torch

    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    start.record()
    ends = []
    for fn, stream in jobs:
        end = torch.cuda.Event(enable_timing=True)
        stream.wait_event(start)
        with torch.cuda.stream(stream):
            fn()
            end.record(stream)
        ends.append(end)
    torch.cuda.synchronize()
    return [start.elapsed_time(e) / 1e3 for e in ends]


def measure_interference(device: str, nbytes: int,
                         streams: Sequence[torch.cuda.Stream]) -> dict[str, float]:
    """Copies of `nbytes` while bf16 matrix products run on a third stream, sized to outlast
    the copies: each direction alone under compute, then both directions under compute, and
    how much the compute slows down."""
    import torch

    buf = _buffers(nbytes, device)
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    one = min(_timed(lambda: a @ a, streams[2]) for _ in range(3))
    h2d = (lambda: buf["dev"].copy_(buf["pinned"], non_blocking=True), streams[0])
    d2h = (lambda: buf["pinned2"].copy_(buf["dev2"], non_blocking=True), streams[1])
    both_alone = max(_concurrent([h2d, d2h]))
    count = max(int(2 * both_alone / one) + 1, 2)
    compute = (lambda: [a @ a for _ in range(count)], streams[2])
    compute_alone = _concurrent([compute])[0]
    c_h2d, t_h2d = _concurrent([compute, h2d])
    c_d2h, t_d2h = _concurrent([compute, d2h])
    c_both, both_h2d, both_d2h = _concurrent([compute, h2d, d2h])
    gbps = nbytes / 1e9
    return {"bytes": nbytes, "h2d_gbps": gbps / t_h2d, "d2h_gbps": gbps / t_d2h,
            "both_h2d_gbps": gbps / both_h2d, "both_d2h_gbps": gbps / both_d2h,
            "both_alone_gbps": 2 * gbps / both_alone, "compute_alone_s": compute_alone,
            "compute_with_h2d_s": c_h2d, "compute_with_d2h_s": c_d2h,
            "compute_with_both_s": c_both,
            "compute_slowdown": max(c_h2d, c_d2h, c_both) / compute_alone, "matmuls": count}


def measure_pin_alloc(sizes: Sequence[int], repeats: int = 3) -> list[dict[str, float]]:
    """Seconds to get pinned host memory by size: a first `torch.empty(pin_memory=True)`
    (after emptying torch's host cache where torch can), a reuse through that cache, and
    page-locking an existing buffer (`cudaHostRegister` + unregister)."""
    import torch

    empty_cache = getattr(torch._C, "_host_emptyCache", None)
    rows = []
    for nbytes in sizes:
        first, reuse = [], []
        for _ in range(repeats):
            if empty_cache is not None:
                empty_cache()
            first.append(_wall_alloc(nbytes))
            reuse.append(_wall_alloc(nbytes))
        rows.append({"bytes": nbytes, "first_s": statistics.median(first),
                     "reuse_s": statistics.median(reuse), "cache_emptied": empty_cache is not None,
                     "register_s": _register_cost(nbytes)})
    return rows


def _wall_alloc(nbytes: int) -> float:
    import torch

    start = time.perf_counter()
    x = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    seconds = time.perf_counter() - start
    del x
    return seconds


def _register_cost(nbytes: int) -> float | None:
    import torch

    host = torch.zeros(nbytes, dtype=torch.uint8)  # touched, so only the pinning is timed
    cudart = torch.cuda.cudart()
    start = time.perf_counter()
    if int(cudart.cudaHostRegister(host.data_ptr(), nbytes, 0)) != 0:
        return None
    seconds = time.perf_counter() - start
    cudart.cudaHostUnregister(host.data_ptr())
    return seconds


def calibrate(device: str = "cuda", *, sizes: Sequence[int] = DEFAULT_SIZES, repeats: int = 5,
              progress: bool | ProgressCallback = True) -> MemorySystem:
    """Measure this machine's host<->GPU link and return it as a GPU-mode memory system."""
    import torch

    if not device.startswith("cuda"):
        raise ConfigError(f"--device {device!r}: calibrate measures the host<->GPU link, so it "
                          "needs --device cuda (host-mode slow tiers use presets or a JSON file)")
    if not torch.cuda.is_available():
        raise ProfileError("--device cuda: torch sees no CUDA GPU on this machine; run "
                           "`autotm calibrate` on the GPU machine")
    if not sizes or min(sizes) <= 0:
        raise ConfigError("calibrate needs positive copy sizes")
    name = torch.cuda.get_device_name(torch.cuda.current_device())
    log.info("calibrating %s over %d sizes, %d repeats", name, len(sizes), repeats)
    with progress_reporter(progress, f"calibrating {name}") as report:
        tables = measure_tables(device, sizes=sizes, repeats=repeats, report=report)
    versions = {"torch": torch.__version__, "cuda": torch.version.cuda or "",
                "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    return summarize(tables, device_name=name, date=time.strftime("%Y-%m-%d"),
                     versions=versions)
