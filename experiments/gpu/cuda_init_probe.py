"""Who makes this process's CUDA context first, in a process that plans and then runs a plan?

The placed allocator can become torch's CUDA allocator only before the context exists
(`runtime.placed.install`); anything on the planning path that touches CUDA first leaves the run
on torch's allocator, its outputs copied into their slots. This runs tests/test_placed_gpu.py's
`digests` (plan the test CNN's arena plans, then run them with the placed allocator) with torch's
lazy CUDA initialisation traced, prints the stack of the first one and whether the placed
allocator was installed (it must be). On the H200 (2026-12-04) the first came from
`torch.backends.cudnn.version()` in the profile fingerprint, which checks every device's
capability.

Usage (GPU machine, repository root, the wheels of setup.sh carried):
    python3 experiments/gpu/cuda_init_probe.py
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> int:
    original = torch.cuda._lazy_init
    seen: list[bool] = []

    def traced(*args, **kwargs):
        if not seen:
            seen.append(True)
            print("the first CUDA initialisation, from:")
            traceback.print_stack(limit=18)
        return original(*args, **kwargs)

    torch.cuda._lazy_init = traced
    from tests.test_placed_gpu import digests

    installed = digests("cnn", True)["installed"]
    print(f"placed allocator installed: {installed}")
    return 0 if installed else 1


if __name__ == "__main__":
    sys.exit(main())
