"""The executor's side of planned addresses: one arena of fast memory, and CUDA-graph replay.

`DeviceArena`: one uint8 tensor of the plan's tensor region (`ArenaLayout.scratch_offset`
bytes), allocated once per run; every fast copy is a typed view at its planned offset. The
scratch region above it is left to torch's caching allocator (kernel workspaces and outputs not
written in place), which the cap bounds: the arena plus the scratch fit the budget.

`GraphReplay`: one steady-state iteration captured as a CUDA graph and replayed. The arena
gives every tensor a fixed address, the pinned pool every slow copy, and what kernels allocate
during the capture comes from the graph's private pool, so a replay reads and writes exactly
what an eager iteration of the same plan would. The copy streams fork from the capturing
stream and join it (the executor's events), as CUDA requires.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from autotm_py.plan import INITIAL
from autotm_py.runtime.pinned import TORCH_DTYPES

if TYPE_CHECKING:
    from autotm_py.ir.graph import Tensor
    from autotm_py.plan import ArenaLayout

log = logging.getLogger(__name__)


class DeviceArena:
    """The plan's tensor region on a device, with typed views at planned offsets."""

    def __init__(self, layout: ArenaLayout, device: torch.device) -> None:
        self.layout = layout
        self.offsets = layout.offsets()
        self.nbytes = layout.scratch_offset
        self.buffer = torch.empty(self.nbytes, dtype=torch.uint8, device=device)
        self._views: dict[tuple[int, int], torch.Tensor | None] = {}

    def view(self, record: int, tensor: Tensor) -> torch.Tensor | None:
        """The slot of the fast copy of `tensor` made by record `record` (`INITIAL` for the
        initial placement), or None if the plan gives it none (pinned, zero-sized). Views are
        made once and kept: every iteration hands out the same tensors (no host work)."""
        key = (max(record, INITIAL), tensor.id)
        if key not in self._views:
            offset = self.offsets.get(key)
            self._views[key] = None if offset is None or tensor.nbytes == 0 else \
                self.buffer[offset:offset + tensor.nbytes].view(
                    TORCH_DTYPES[tensor.dtype]).view(tensor.shape)
        return self._views[key]


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
        self.graph = torch.cuda.CUDAGraph()
        self.failed: str | None = None
        first: list[str] = []

        def guarded() -> None:
            try:
                body()
            except Exception as exc:
                first.append(f"{where()}: {_first_line(exc)}")  # before capture_end's error
                raise

        try:
            with torch.cuda.graph(self.graph, stream=stream):
                guarded()
        except Exception as exc:  # any failure means: run eagerly, and say why
            self.failed = first[0] if first else f"capture: {_first_line(exc)}"
            log.info("CUDA graph capture failed at %s", self.failed)
            torch.cuda.synchronize()

    def replay(self) -> None:
        self.graph.replay()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"
