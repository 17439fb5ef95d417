"""How long the GPU itself works during one iteration: the device side of a torch profile.

Issue 14 item 4 asks that an iteration replayed as a CUDA graph take no longer than 1.05x the
GPU's own work: whatever is left is the host (launches, Python) or gaps between a graph's
nodes. The kernels' device times summed over a profile answer it for an iteration whose
kernels run one after the other (the all-fast iteration), but a plan's copies run beside its
kernels on two more streams, and a replay runs its nodes on streams of the graph's own. So
this measures the *busy time*: the length of the union of every kernel, copy and memset
interval on any stream of one iteration, traced by CUPTI through `torch.profiler`
(which sees the kernels and copies of a graph replay too). `iteration time / busy time` is
then 1.0 for a GPU that never waits for its host; the part above it is time the GPU sat idle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

COPY_PREFIXES = ("Memcpy", "Memset")


@dataclass(frozen=True)
class DeviceActivity:
    """The device side of one profiled iteration, seconds. `span_s`: first start to last
    end; `busy_s`: covered by at least one kernel, copy or memset; `kernel_s`: the kernels'
    durations summed (the classic device-time sum); `copy_s`: the copies' and memsets'."""

    events: int
    span_s: float
    busy_s: float
    kernel_s: float
    copy_s: float


def union_length(intervals: Iterable[tuple[int, int]]) -> int:
    """Total length covered by half-open intervals (start, end)."""
    total, end = 0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def device_events(prof) -> list[tuple[str, int, int]]:
    """(name, start ns, duration ns) of the device-side events of a finished profile."""
    return [(e.name(), int(e.start_ns()), int(e.duration_ns()))
            for e in prof.profiler.kineto_results.events()
            if e.device_type() == torch.autograd.DeviceType.CUDA]


def activity_of(events: list[tuple[str, int, int]]) -> DeviceActivity:
    """Span, busy time and the kernel and copy sums of one iteration's device events."""
    if not events:
        return DeviceActivity(0, 0.0, 0.0, 0.0, 0.0)
    begin = min(start for _, start, _ in events)
    end = max(start + dur for _, start, dur in events)
    copies = sum(dur for name, _, dur in events if name.startswith(COPY_PREFIXES))
    kernels = sum(dur for _, _, dur in events) - copies
    busy = union_length((start, start + dur) for _, start, dur in events)
    return DeviceActivity(len(events), (end - begin) / 1e9, busy / 1e9, kernels / 1e9,
                          copies / 1e9)


def profile_device(step: Callable[[], object], device: torch.device | str) -> DeviceActivity:
    """Run `step` once under the torch profiler (CUDA activity only: no host-side op
    recording to slow the host down) and measure what the device did."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize(device)
    return activity_of(device_events(prof))
