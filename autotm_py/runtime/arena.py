"""The executor's side of planned addresses: one arena of fast memory, and CUDA-graph replay.

`DeviceArena`: one uint8 tensor of the plan's tensor region (`ArenaLayout.scratch_offset`
bytes), allocated once per run; every fast copy is a typed view at its planned offset. The
scratch region above it is left to torch's caching allocator (kernel workspaces and outputs not
written in place), which the cap bounds: the arena plus the scratch fit the budget.

`StaticInputs`: for a CUDA graph captured without an arena (an uncapped run, such as the
all-fast reference), fixed buffers only for the tensors an iteration starts with; everything
the iteration makes comes from the graph's private pool, where kernels allocate their outputs
themselves, so no output is copied into a slot.

`GraphReplay`: one steady-state iteration captured as a CUDA graph and replayed. The arena (or
the static inputs) gives every tensor the iteration starts with a fixed address, the pinned
pool every slow copy, and what kernels allocate during the capture comes from the graph's
private pool, so a replay reads and writes exactly what an eager iteration of the same plan
would. The copy streams fork from the capturing
stream and join it (the executor's events), as CUDA requires.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from autotm_py.kernels.util import empty_like_tensor, typed_view
from autotm_py.plan import INITIAL
from autotm_py.runtime.device import cuda_index

if TYPE_CHECKING:
    from autotm_py.ir.graph import Tensor
    from autotm_py.plan import ArenaLayout

log = logging.getLogger(__name__)


# The arena starts this far into its allocation, so that no slot's address is the address
# torch allocated (the placed allocator hands slot addresses to kernels' allocations, and torch
# keys its allocations by address: `runtime.placed`).
LEAD_BYTES = 512


class DeviceArena:
    """The plan's tensor region on a device, with typed views at planned offsets."""

    def __init__(self, layout: ArenaLayout, device: torch.device) -> None:
        self.layout = layout
        self.offsets = layout.offsets()
        self.nbytes = layout.scratch_offset
        self.buffer = torch.empty(LEAD_BYTES + self.nbytes, dtype=torch.uint8,
                                  device=device)[LEAD_BYTES:]
        self._views: dict[tuple[int, int], torch.Tensor | None] = {}
        # scratch windows (`autotm optimize --scratch windows`): a record's scratch inside the
        # tensors' region, as its bytes
        self._windows = {record: self.buffer[b.offset:b.offset + b.nbytes]
                         for record, b in layout.windows().items()}

    def window(self, record: int) -> torch.Tensor | None:
        """The scratch window of record `record` (its bytes), None if it has none."""
        return self._windows.get(record)

    def view(self, record: int, tensor: Tensor) -> torch.Tensor | None:
        """The slot of the fast copy of `tensor` made by record `record` (`INITIAL` for the
        initial placement), or None if the plan gives it none (pinned, zero-sized). Views are
        made once and kept: every iteration hands out the same tensors (no host work)."""
        key = (max(record, INITIAL), tensor.id)
        if key not in self._views:
            offset = self.offsets.get(key)
            self._views[key] = None if offset is None or tensor.nbytes == 0 else \
                typed_view(self.buffer[offset:offset + tensor.nbytes], tensor)
        return self._views[key]


class StaticInputs:
    """Fixed buffers for the fast copies an iteration starts with (weights, data, carried
    state), made once: the slots of a CUDA graph captured without an arena. The executor copies
    each carried value into its buffer as the iteration ends (`Executor._steady`), inside the
    captured iteration, so every replay starts from the last one's results. Any other fast
    copy has no slot (None): torch allocates it, from the graph's private pool while capturing.
    Unbounded: for runs without a cap (an arena is what keeps a capped capture in its budget)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._views: dict[int, torch.Tensor | None] = {}

    def view(self, record: int, tensor: Tensor) -> torch.Tensor | None:
        if record > INITIAL:
            return None
        if tensor.id not in self._views:
            self._views[tensor.id] = None if tensor.nbytes == 0 else \
                empty_like_tensor(tensor, self.device)
        return self._views[tensor.id]


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors' bytes meet (both contiguous)."""
    if a.device != b.device or not a.numel() or not b.numel():
        return False
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.numel() * b.element_size() and b0 < a0 + a.numel() * a.element_size()


class GraphReplay:
    """Capture `body` (one iteration) on `stream` as a CUDA graph; `replay()` runs it. The
    caller has run an eager iteration on `stream` first (cuBLAS and cuDNN set themselves up per
    stream, which a capture does not allow). `failed` says why the capture did not work (None
    if it did): the caller runs eagerly."""

    def __init__(self, body: Callable[[], None], where: Callable[[], str],
                 stream: torch.cuda.Stream) -> None:
        self.graph: torch.cuda.CUDAGraph | None = torch.cuda.CUDAGraph()
        self.failed: str | None = None
        first: list[str] = []

        def guarded() -> None:
            try:
                body()
            except Exception as exc:
                first.append(f"{where()}: {_first_line(exc)}")  # before capture_end's error
                raise

        rng = _default_generator(stream.device)
        rng_before = rng.get_state()
        # The blocks the eager warm-up left cached serve no allocation of the capture (it
        # allocates from the graph's private pool) but count against the cap: hand them back.
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        pool = torch.cuda.graph_pool_handle()
        begun = ended = False
        try:
            with torch.cuda.stream(stream):
                self.graph.capture_begin(pool=pool)
                begun = True
                try:
                    guarded()
                finally:
                    self.graph.capture_end()
                    ended = True
        except Exception as exc:  # any failure means: run eagerly, and say why
            self.failed = first[0] if first else f"capture: {_first_line(exc)}"
            log.info("CUDA graph capture failed at %s", self.failed)
            torch.cuda.synchronize()
            _restore_generator(rng, rng_before)
            self.graph = None  # torch releases its pool if the capture ended
            if begun and not ended:
                _release_pool(stream.device, pool)
            torch.cuda.empty_cache()

    def replay(self) -> None:
        assert self.graph is not None, "replay() of a capture that failed"
        self.graph.replay()


def _default_generator(device: torch.device) -> torch.Generator:
    return torch.cuda.default_generators[cuda_index(device)]


def _release_pool(device: torch.device, pool: tuple[int, int]) -> None:
    """Give the private pool of a capture that never ended back to the allocator. torch
    releases a graph's pool when the graph goes only if `capture_end` succeeded; where it
    raised (an invalidated capture), the blocks the capture allocated stayed cached for the
    rest of the process, counted against every later run's cap. `_cuda_endAllocateToPool` and
    `_cuda_releasePool` are torch's own calls for that (`torch.cuda.use_mem_pool` ends with
    them); without them (another torch) the blocks stay."""
    index = cuda_index(device)
    end = getattr(torch._C, "_cuda_endAllocateToPool", None)
    if end is not None:
        # capture_end raised before it told the allocator the capture was over: until it is
        # told, the allocator believes a capture is under way and neither empty_cache nor its
        # own retry after an out-of-memory gives anything back (on the H100 every later capped
        # run of the process then ran out of memory)
        with contextlib.suppress(RuntimeError):  # (raised where it was told)
            end(index, pool)
    release = getattr(torch._C, "_cuda_releasePool", None)
    if release is not None:
        release(index, pool)


def _restore_generator(rng: torch.Generator, state: torch.Tensor) -> None:
    """Give the device's default generator a fresh state equal to `state` (its seed and offset
    before the capture). A capture that fails inside `capture_end` never runs the generator's
    capture epilogue, so the generator stays marked as capturing and every later random op of
    the process (dropout, torch.rand) fails with "Offset increment outside graph capture";
    swapping in a fresh state object clears that, and random ops go on as if the capture had
    not been tried."""
    fresh = torch.Generator(device=rng.device)
    fresh.set_state(state)
    rng.graphsafe_set_state(fresh)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"
