"""Time and host memory of `capture_module` on a GPT decoder of `experiments/gpu/beyond_card.py`'s
"medium" size (0.30B parameters), in this process: the capture's seconds and its peak resident
memory above the built module (ru_maxrss), for the Trainer's setup on large modules
(docs/training-loop.md). Run each version in a fresh process:

    python experiments/capture_cost.py [--repo DIR] [--no-values]
        # DIR: a checkout to import autotm_py from; --no-values: as the Trainer captures
        # (`capture_module(..., values=False)`: no copy of the weights)
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1])
    p.add_argument("--no-values", action="store_true",
                   help="capture_module(values=False), as the Trainer captures")
    args = p.parse_args(argv)
    sys.path[:0] = [str(args.repo), str(args.repo / "experiments" / "gpu")]
    import torch
    from trainer_bench import GPT2

    from autotm_py.frontend.capture import capture_module

    torch.manual_seed(0)
    net = GPT2(vocab=50257, dim=1536, layers=8, heads=12, seq=512)
    tokens = torch.randint(0, 50257, (1, 512))
    built = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    started = time.perf_counter()
    capture_module(net, (tokens,), **({"values": False} if args.no_values else {}))
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"{args.repo}: capture {seconds:.1f} s, peak {(peak - built) / 1e9:.2f} GB above the "
          f"built module ({built / 1e9:.2f} GB)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
