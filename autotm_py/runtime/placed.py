"""The placed allocator: kernels' outputs allocated at their planned arena offsets.

In an arena run (docs/gpu.md, "Planned addresses") a kernel with no `out=` form (ConvGrad,
the batch-norm gradient, attention, layer norm...) lets torch allocate its outputs, and the
executor copies each into its slot: 8-14 ms of device-to-device copies per iteration of the
benchmark CNNs. With this allocator installed as torch's CUDA allocator
(`torch.cuda.memory.CUDAPluggableAllocator`, a C shim, `placed_alloc.c`), the executor names
the slots before such a kernel runs (`PlacedLib.expecting`) and the first allocation of each
slot's exact size gets the slot's address: the kernel writes its output where the plan puts
it, and nothing is copied. An output that lands elsewhere (the kernel allocated it at another
size, or in another order) is copied as before, so the results never depend on it.

A plan with scratch windows (`autotm optimize --scratch windows`) gives each kernel's scratch
an offset inside the arena, free of tensors while that kernel runs; the executor opens it
around the kernel (`PlacedLib.window`) and the kernel's workspaces and temporaries come from
there. Everything else torch allocates (the arena, cuBLAS's workspaces, anything outside a
window) comes first-fit from one region reserved once, of the cap's size under a cap, with no
CUDA call per allocation; a CUDA graph captures through it, and after a capture the region is
fenced so nothing outside the graph lands in its scratch. What does not fit goes to cudaMalloc
and is reported as overflow; while a graph may use it (from its capture until it is gone) it
is allocated in CUDA's relaxed capture mode and not freed (`PlacedLib.hold_overflow`), as
torch's own allocator treats a capture's blocks. torch's statistics (`max_memory_allocated`...)
do not exist under a pluggable allocator; `runtime.device` asks `stats()` instead.

It must be installed before the process first uses CUDA (`install`); `autotm run --arena`
does that. The shim is compiled at first use with the system's C compiler (`cc`, or `$CC`)
into the user's cache; with no compiler the run keeps the caching allocator and the copies,
and says so. Off CUDA nothing here is used; the tests drive the shim's bookkeeping over
made-up addresses (`PlacedLib.use_region`).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

SOURCE = Path(__file__).with_name("placed_alloc.c")
MAX_MISSES = 8  # placed_alloc.c's table of the largest requests beyond the region
# what an uncapped region leaves of the device's free memory (placed_alloc.c's reserve_region:
# CUDA's and cuBLAS's own allocations made later, outside the region)
REGION_SPARE = 1 << 30
ENV_OFF = "AUTOTM_PLACED"  # "0": keep torch's caching allocator (and the slot copies)


@dataclass(frozen=True)
class PlacedStats:
    region_bytes: int
    in_use_bytes: int
    peak_in_use_bytes: int
    peak_extent_bytes: int  # the highest region byte in use at any time since the reset
    overflow_bytes: int  # held from cudaMalloc because the region had no room
    overflow_allocations: int
    placed: int  # allocations served at a planned address (since install)
    region_start: int
    windowed: int = 0  # allocations served from scratch windows (since install)


@dataclass
class WindowUse:
    """One kernel's scratch window: whether it opened, and (after the kernel) the bytes its
    kernel allocated outside it because it had no room (from the region) and the largest such
    request."""

    opened: bool
    spilled_bytes: int = 0
    largest_spill: int = 0


class WindowLeak(RuntimeError):
    """An allocation served from a kernel's scratch window was still live when the window
    closed."""


class PlacedLib:
    """The shim's functions (ctypes). One instance per loaded library: its state is global."""

    def __init__(self, path: Path) -> None:
        self.path = path
        lib = ctypes.CDLL(str(path))
        size, ptr = ctypes.c_size_t, ctypes.c_uint64
        for name, args, res in (
                ("autotm_alloc", [size, ctypes.c_int, ctypes.c_void_p], ctypes.c_void_p),
                ("autotm_free", [ctypes.c_void_p, size, ctypes.c_int, ctypes.c_void_p], None),
                ("autotm_request_region", [size], None),
                ("autotm_use_region", [ptr, size], None),
                ("autotm_set_arena", [ptr, size], None),
                ("autotm_expect", [ptr, size], ctypes.c_int),
                ("autotm_expect_clear", [], None),
                ("autotm_window_open", [ptr, size], ctypes.c_int),
                ("autotm_window_close", [ctypes.POINTER(ctypes.c_uint64)], ctypes.c_long),
                ("autotm_fence", [ctypes.c_int], None),
                ("autotm_reset_peaks", [], None),
                ("autotm_tag", [ctypes.c_long], None),
                ("autotm_misses", [ctypes.POINTER(ctypes.c_int64),
                                   ctypes.POINTER(ctypes.c_uint64)], ctypes.c_int),
                ("autotm_hold_overflow", [ctypes.c_int], ctypes.c_int),
                ("autotm_use_host_overflow", [], ctypes.c_long),
                ("autotm_stats", [ctypes.POINTER(ctypes.c_uint64)], None)):
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, res
        self.lib = lib

    # ---- the executor's calls ----------------------------------------------------------------
    def set_arena(self, start: int, nbytes: int) -> None:
        self.lib.autotm_set_arena(start, nbytes)

    @contextlib.contextmanager
    def expecting(self, slots: Sequence[tuple[int, int]]) -> Iterator[int]:
        """While the body runs, the first allocation of each slot's size gets its address
        (slots: (address, bytes), strictly inside the arena); yields how many were armed."""
        armed = sum(self.lib.autotm_expect(start, nbytes) for start, nbytes in slots)
        try:
            yield armed
        finally:
            self.lib.autotm_expect_clear()

    @contextlib.contextmanager
    def window(self, start: int, nbytes: int) -> Iterator[WindowUse]:
        """While the body runs, what is not a slot is allocated first-fit in [start, start +
        nbytes) (a kernel's scratch window, inside the arena) before the region; yields a
        `WindowUse` that says, once the body is done, whether the window opened and what the
        kernel got from outside it. Raises `WindowLeak` if an allocation made there outlives
        the body (those bytes hold other tensors once the kernel is done)."""
        use = WindowUse(bool(self.lib.autotm_window_open(start, nbytes)))
        failed = True
        spilled = (ctypes.c_uint64 * 2)()
        try:
            yield use
            failed = False
        finally:
            live = int(self.lib.autotm_window_close(spilled))
            use.spilled_bytes, use.largest_spill = int(spilled[0]), int(spilled[1])
        if live and not failed:
            raise WindowLeak(f"{live} allocation(s) made in a scratch window outlived their "
                             "kernel")

    def tag(self, record: int) -> None:
        """Name the record whose allocations come next (-1: none), for `misses`."""
        self.lib.autotm_tag(record)

    def misses(self) -> list[tuple[int, int]]:
        """The largest requests the region could not serve since the last call (they went to
        cudaMalloc, beyond the cap), as (tag, bytes), largest first; at most 8."""
        tags, sizes = (ctypes.c_int64 * MAX_MISSES)(), (ctypes.c_uint64 * MAX_MISSES)()
        n = int(self.lib.autotm_misses(tags, sizes))
        return [(int(tags[i]), int(sizes[i])) for i in range(n)]

    def fence(self, on: bool) -> None:
        self.lib.autotm_fence(int(on))

    def hold_overflow(self, on: bool) -> int:
        """From before a CUDA graph's capture (True) until no graph is left (False): what
        overflows the region is allocated in CUDA's relaxed capture mode and kept (the graph's
        replays may use it; a capture forbids cudaFree), its frees done when the hold is
        lifted. Returns the frees still waiting."""
        return int(self.lib.autotm_hold_overflow(int(on)))

    def reset_peaks(self) -> None:
        self.lib.autotm_reset_peaks()

    def stats(self) -> PlacedStats:
        out = (ctypes.c_uint64 * 9)()
        self.lib.autotm_stats(out)
        return PlacedStats(*(int(v) for v in out))

    # ---- the bookkeeping without a GPU (tests) ----------------------------------------------
    def use_host_overflow(self) -> int:
        """Tests: overflow from the C heap instead of cudaMalloc, the capture-mode switches
        counted; returns how many there were so far."""
        return int(self.lib.autotm_use_host_overflow())

    def use_region(self, start: int, nbytes: int) -> None:
        self.lib.autotm_use_region(start, nbytes)

    def alloc(self, nbytes: int) -> int:
        return int(self.lib.autotm_alloc(nbytes, 0, None) or 0)

    def free(self, start: int, nbytes: int) -> None:
        self.lib.autotm_free(start, nbytes, 0, None)


def build(cache: Path | None = None) -> Path:
    """The compiled shim (compiled once per source version into the cache; written under a
    temporary name and renamed, so concurrent builds never load a half-written library).
    Raises OSError with the reason if no C compiler can build it."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    cache = cache or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "autotm_py"
    target = cache / f"placed_alloc-{digest}.so"
    if target.exists():
        return target
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise OSError("no C compiler (cc) to build the placed allocator")
    cache.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=cache, suffix=".so")
    os.close(fd)
    try:
        done = subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-o", tmp, str(SOURCE),
                               "-ldl"], capture_output=True, text=True, check=False)
        why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
    except OSError as exc:
        done, why = None, str(exc)
    if done is None or done.returncode != 0:
        Path(tmp).unlink(missing_ok=True)
        raise OSError(f"{compiler} could not build the placed allocator: {why}")
    os.replace(tmp, target)
    return target


_ACTIVE: PlacedLib | None = None


def active() -> PlacedLib | None:
    """The installed placed allocator, None if torch's caching allocator is in use."""
    return _ACTIVE


def install(region_bytes: int | None) -> str | None:
    """Make the placed allocator torch's CUDA allocator, reserving `region_bytes` (None: all
    the device's free memory but 1 GiB) at the first allocation. Returns None once installed
    (or if it already was), else why not: then torch's caching allocator stays."""
    global _ACTIVE
    import torch

    if _ACTIVE is not None:
        return None
    if os.environ.get(ENV_OFF) == "0":
        return f"{ENV_OFF}=0"
    if torch.cuda.is_initialized():
        return "CUDA was used in this process before the run (install it first)"
    try:
        lib = PlacedLib(build())
    except OSError as exc:
        return str(exc)
    lib.lib.autotm_request_region(region_bytes or 0)
    allocator = torch.cuda.memory.CUDAPluggableAllocator(str(lib.path), "autotm_alloc",
                                                         "autotm_free")
    torch.cuda.memory.change_current_allocator(allocator)
    _ACTIVE = lib
    return None
