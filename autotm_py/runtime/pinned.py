"""The slow tier of the executor: one host buffer (pinned on GPU machines), allocated once.

Every tensor that ever lives in the slow tier gets a fixed region for the whole run, so there
is no per-iteration allocation and no reuse race between copy streams. A carried pair (W, W')
shares one region: W' is written there only after W's last use, and the next iteration finds
its weights where they started.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from autotm_py.errors import ConfigError
from autotm_py.kernels.util import typed_view
from autotm_py.memory.tiers import SLOW
from autotm_py.plan import Compute, Move, Plan
from autotm_py.units import format_bytes

if TYPE_CHECKING:
    from autotm_py.ir.graph import Tensor, TensorGraph

ALIGN = 256


def slow_tensors(graph: TensorGraph, plan: Plan) -> list[int]:
    """Tensor ids that are in the slow tier at some point of the plan, in first-seen order."""
    seen = dict.fromkeys(t for t, tiers in plan.initial.items() if SLOW in tiers)
    for rec in plan.records:
        if isinstance(rec, Move) and rec.to == SLOW:
            seen.setdefault(rec.tensor)
        elif isinstance(rec, Compute):
            kernel = graph.kernels[rec.kernel]
            n_in = len(kernel.inputs)
            for j, tid in enumerate(kernel.outputs):
                if rec.placement[n_in + j] == SLOW:
                    seen.setdefault(tid)
    return list(seen)


def slow_tier_layout(graph: TensorGraph, plan: Plan) -> tuple[dict[int, int], int]:
    """Byte offset of every slow-tier tensor in the pool (carried pairs share a region), and
    the pool's size."""
    partner = {last: first for first, last in graph.carried}
    offsets: dict[int, int] = {}
    end = 0
    for tid in slow_tensors(graph, plan):
        owner = partner.get(tid, tid)
        if owner in offsets:
            offsets[tid] = offsets[owner]
            continue
        offsets[owner] = offsets[tid] = end
        end += -(-graph.tensors[tid].nbytes // ALIGN) * ALIGN
    return offsets, end


def available_host_bytes() -> int | None:
    """The host memory the kernel says a new allocation can have without swapping
    (`MemAvailable` of /proc/meminfo); None where it does not say (not Linux)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_host_fits(need: int, what: str, fix: str) -> None:
    """A `ConfigError` naming `what` and `fix` where `need` bytes exceed the host's available
    memory: pinned memory cannot be swapped, and a pool larger than the host is killed by
    the kernel midway, after minutes of pinning (a 3.33B decoder's setup, 2026-12-04)."""
    available = available_host_bytes()
    if available is not None and need > available:
        raise ConfigError(f"{what} needs {format_bytes(need)} of host memory, and this host has "
                          f"{format_bytes(available)} available: {fix}")


def pinned_footprint(nbytes: int, pin: bool) -> int:
    """The host memory a pool of `nbytes` takes. Pinned, torch's caching host allocator rounds
    every allocation up to the next power of two (for reuse; `CachingHostAllocator.h`): the
    5.12B decoder's 49.9 GB pool at 48 GiB took 64 GiB, and the host's available memory fell
    to 0.8 GB (H100, 2026-12-05). Not pinned (on the CPU), its own size."""
    if not pin or nbytes <= 0:
        return max(nbytes, 0)
    return 1 << (nbytes - 1).bit_length()


SLOW_TIER_FIX = "plan with a larger fast-memory budget (less in the slow tier), or free host memory"


class PinnedPool:
    """A host byte buffer with typed views at fixed offsets."""

    def __init__(self, offsets: dict[int, int], nbytes: int, *, pin: bool) -> None:
        check_host_fits(pinned_footprint(nbytes, pin),
                        "the plan's slow tier (one pinned host pool)", SLOW_TIER_FIX)
        self.offsets = offsets
        self.nbytes = nbytes
        self.buffer = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin and nbytes > 0)
        # made once per tensor: three torch calls per copy to the slow tier were host time an
        # eager asynchronous plan spends per move (experiments/journal/gpu-2026-11.md)
        self._views: dict[int, torch.Tensor] = {}

    def view(self, tid: int, tensor: Tensor) -> torch.Tensor:
        view = self._views.get(tid)
        if view is None:
            start = self.offsets[tid]
            view = self._views[tid] = typed_view(self.buffer[start:start + tensor.nbytes], tensor)
        return view


class HostUploads:
    """The copies of host values (a batch, the learning rate) into the device tensors where an
    iteration starts them, asynchronous on the current stream. A pinned source laid out as its
    target is copied from directly; any other first into a pinned staging buffer laid out as
    the target (made once per tensor; a layout change made there by torch's parallel CPU copy),
    because CUDA copies pageable memory synchronously through the driver's small staging
    buffers, and torch changes a layout on the host through a pageable temporary: ResNet-200's
    38 MB batch held the host 12-15 ms a step on the H200 (2026-12-04), its replayed step's
    kernels 47 ms. Like `x.to("cuda", non_blocking=True)`, the copy reads a pinned source
    after the call returns: do not write into it before the step's result is read. `once`: a
    value uploaded a single time (a carried tensor's first value: a weight, optimizer state) is
    copied synchronously and keeps no staging buffer, which would otherwise hold a pinned host
    copy of everything the plan starts in fast memory for the whole run (gigabytes on a model
    of billions of parameters)."""

    def __init__(self) -> None:
        self._staging: dict[int, tuple[torch.Tensor, torch.cuda.Event]] = {}

    def copy(self, tid: int, source: torch.Tensor, dst: torch.Tensor, once: bool = False
             ) -> None:
        if source.is_pinned() and source.stride() == dst.stride() and \
                source.dtype == dst.dtype:
            dst.copy_(source, non_blocking=True)
            return
        if once:
            self._staging.pop(tid, None)
            dst.copy_(source)
            return
        buffer = self._buffer(tid, dst)
        buffer.copy_(source)
        dst.copy_(buffer, non_blocking=True)
        uploaded = torch.cuda.Event()
        uploaded.record()
        self._staging[tid] = (buffer, uploaded)

    @property
    def staged(self) -> frozenset[int]:
        """The tensors whose staging buffers are kept (those uploaded at every step)."""
        return frozenset(self._staging)

    def _buffer(self, tid: int, dst: torch.Tensor) -> torch.Tensor:
        """`tid`'s staging buffer, laid out as `dst`, once its last upload has read it."""
        staged = self._staging.get(tid)
        if staged is not None and staged[0].shape == dst.shape and \
                staged[0].stride() == dst.stride() and staged[0].dtype == dst.dtype:
            staged[1].synchronize()
            return staged[0]
        return torch.empty_strided(dst.shape, dst.stride(), dtype=dst.dtype, pin_memory=True)
