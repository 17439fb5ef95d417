"""The slow tier of the executor: one host buffer (pinned on GPU machines), allocated once.

Every tensor that ever lives in the slow tier gets a fixed region for the whole run, so there
is no per-iteration allocation and no reuse race between copy streams. A carried pair (W, W')
shares one region: W' is written there only after W's last use, and the next iteration finds
its weights where they started.
"""

from __future__ import annotations

import logging
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING

import numpy
import torch

from autotm_py.errors import ConfigError
from autotm_py.kernels.util import typed_view
from autotm_py.memory.tiers import SLOW
from autotm_py.plan import Compute, Move, Plan
from autotm_py.units import format_bytes

if TYPE_CHECKING:
    from autotm_py.ir.graph import Tensor, TensorGraph

ALIGN = 256
log = logging.getLogger(__name__)


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


def registers_host_memory() -> bool:
    """Whether host memory can be pinned at its own size here: a CUDA runtime that torch
    exposes `cudaHostRegister` through (`torch.cuda.cudart()`)."""
    if not torch.cuda.is_available():
        return False
    try:
        return hasattr(torch.cuda.cudart(), "cudaHostRegister")
    except (AssertionError, RuntimeError):  # no libcudart bindings in this build
        return False


def pinned_footprint(nbytes: int, pin: bool) -> int:
    """The host memory a pool of `nbytes` takes: its own size where it is registered with CUDA
    (`pinned_host_buffer`) or not pinned (on the CPU). Pinned by torch's caching host
    allocator instead, the next power of two: it rounds every allocation up for reuse
    (`CachingHostAllocator.h`), and the 5.12B decoder's 49.9 GB pool at 48 GiB took 64 GiB, the
    host's available memory falling to 0.8 GB (H100, 2026-12-05)."""
    if not pin or nbytes <= 0 or registers_host_memory():
        return max(nbytes, 0)
    return _power_of_two(nbytes)


def _power_of_two(nbytes: int) -> int:
    return 1 << (nbytes - 1).bit_length()


def pinned_host_buffer(nbytes: int, *, mapped: bool = False) -> torch.Tensor:
    """`nbytes` of page-locked host memory at its own size: allocated pageable, its pages
    touched by torch's parallel fill (registering untouched pages faults them in one at a time
    in the driver), then registered with CUDA, so that copies from and to it are asynchronous
    DMA as from torch's pinned memory, without the power-of-two rounding of torch's allocator
    (19-28 GB of a 5.12B decoder's host memory). Unregistered when the buffer is collected;
    torch's pinned allocator where registration is unavailable or refused. `mapped`: also
    portable and mapped into the devices' address space (for kernels that read it in place:
    the embedding tables' zero-copy host tier)."""
    if not registers_host_memory():
        return _torch_pinned(nbytes)
    started = time.perf_counter()
    # the memory is a numpy array's, which the tensor keeps alive until its storage (every view
    # included) is freed; the finalizer, run as the array is collected and before numpy frees
    # its memory, unregisters it: no page is freed while registered, none unregistered in use
    owner = numpy.empty(nbytes, dtype=numpy.uint8)
    buffer = torch.frombuffer(owner, dtype=torch.uint8).zero_()
    flags = 3 if mapped else 0  # cudaHostRegisterPortable | cudaHostRegisterMapped, or Default
    error = torch.cuda.cudart().cudaHostRegister(buffer.data_ptr(), nbytes, flags)
    if int(error) != 0:
        log.warning("cudaHostRegister of %s refused (CUDA error %s): pinning it with torch's "
                    "allocator, rounded up to %s", format_bytes(nbytes), int(error),
                    format_bytes(_power_of_two(nbytes)))
        del buffer, owner
        return _torch_pinned(nbytes)
    weakref.finalize(owner, _unregister, buffer.data_ptr())
    log.info("pinned %s of host memory at its own size in %.1f s", format_bytes(nbytes),
             time.perf_counter() - started)
    return buffer


def _torch_pinned(nbytes: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)


def _unregister(address: int) -> None:
    torch.cuda.cudart().cudaHostUnregister(address)


SLOW_TIER_FIX = "plan with a larger fast-memory budget (less in the slow tier), or free host memory"


class PinnedPool:
    """A host byte buffer with typed views at fixed offsets."""

    def __init__(self, offsets: dict[int, int], nbytes: int, *, pin: bool) -> None:
        check_host_fits(pinned_footprint(nbytes, pin),
                        "the plan's slow tier (one pinned host pool)", SLOW_TIER_FIX)
        self.offsets = offsets
        self.nbytes = nbytes
        self.buffer = pinned_host_buffer(nbytes) if pin and nbytes > 0 else \
            torch.empty(nbytes, dtype=torch.uint8)
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
