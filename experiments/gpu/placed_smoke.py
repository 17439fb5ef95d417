"""Smoke test of the placed allocator (`autotm_py/runtime/placed.py`) on a GPU, in a fresh
process: installed as torch's allocator, cuDNN's convolution backward allocates its input
gradient at the address it is offered, bitwise what the same call computes elsewhere, and a
CUDA graph captures and replays through the allocator.

Usage (GPU machine, repository root): python3 experiments/gpu/placed_smoke.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    from autotm_py.runtime import placed

    print("install:", placed.install(4 << 30))  # before anything uses CUDA
    import torch

    lib = placed.active()
    x = torch.randn(32, 64, 56, 56, device="cuda")
    w = torch.randn(64, 64, 3, 3, device="cuda")
    gy = torch.randn_like(x)
    arena = torch.empty(200 << 20, dtype=torch.uint8, device="cuda")
    lib.set_arena(arena.data_ptr(), arena.numel())
    slot = arena[4096:4096 + x.numel() * 4].view(torch.float32).view(x.shape)
    args = (gy, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, False])
    with lib.expecting([(slot.data_ptr(), slot.numel() * 4)]) as armed:
        gi, _, _ = torch.ops.aten.convolution_backward(*args)
    print("armed", armed, "placed:", gi.data_ptr() == slot.data_ptr(), gi.stride(), lib.stats())
    ref = torch.ops.aten.convolution_backward(*args)[0]
    print("equal:", torch.equal(gi, ref), torch.equal(slot, ref))
    del gi
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y = torch.nn.functional.conv2d(x, w, padding=1)
        graph = torch.cuda.CUDAGraph()
        graph.capture_begin()
        y2 = torch.nn.functional.conv2d(x, w, padding=1).relu()
        graph.capture_end()
    torch.cuda.current_stream().wait_stream(side)
    graph.replay()
    torch.cuda.synchronize()
    print("graph equal:", torch.equal(y2, y.relu()), lib.stats())


if __name__ == "__main__":
    main()
