"""Produce the results the figures read, with `autotm bench` (resumable: rerun to continue).

    python experiments/run_experiments.py host      # Fig. 7, 9, ILP times (this CPU, host mode)
    python experiments/run_experiments.py sweep     # Fig. 10 (Inception-v4 budget sweep)
    python experiments/run_experiments.py gpu       # Fig. 11, 12 (a CUDA machine; executes)
    python experiments/run_experiments.py all --dry-run   # print the commands only

Host-mode suites plan for the `optane` memory system with this machine's kernel profiles
(shipped CPU profiles, or `autotm profile MODEL --device cpu` first); their times are the
simulator's predictions. The GPU suite runs every plan and every baseline on the GPU and records
measured times next to the predictions. Each suite writes results/<suite>.csv and .json.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

# The paper's conventional workloads (its batches were 512-2048 on a 1.5 TB Optane server; the
# default batch here is small enough for this machine's profiles: override with --batch).
SUITES: dict[str, dict[str, str]] = {
    "host": {
        "out": "host_conventional",
        "models": "vgg19,resnet200,inception_v4,densenet264",
        "ratios": "1:8,1:4,1:1",
        "strategies": "static,sync",
        "device": "cpu",
        "batch": "16",
        "extra": "--workers 1",  # its solve times are a result (Fig. ILP times): one at a time
    },
    "sweep": {
        "out": "host_inception_sweep",
        "models": "inception_v4",
        "ratios": "1:9,1:6,1:4,1:3,1:2,2:3,1:1,3:2,2:1,3:1,5:1,9:1",
        "strategies": "static,sync",
        "device": "cpu",
        "batch": "16",
        "extra": "--workers 1",
    },
    "gpu": {
        "out": "gpu_h100",
        "models": "resnet50,vgg19,inception_v4,densenet264",
        "ratios": "1:1,1:2",
        "strategies": "sync,async",
        "device": "cuda",
        "batch": "32",
        # the paper's move-only plans, run eagerly (the GPU defaults since 2026-12-02 are
        # async+recompute in an arena, replayed: docs/gpu.md, "Run modes")
        "extra": "--execute --recompute off --no-arena --no-replay --no-channels-last",
    },
}


def command(suite: str, args: argparse.Namespace) -> list[str]:
    s = SUITES[suite]
    cmd = ["autotm", "bench", "--models", args.models or s["models"],
           "--ratios", args.ratios or s["ratios"], "--strategies", s["strategies"],
           "--device", s["device"], "--batch", str(args.batch or s["batch"]), "--training",
           "--solvers", args.solvers, "-o", str(args.results / f"{s['out']}.csv")]
    if args.time_limit:
        cmd += ["--time-limit", str(args.time_limit)]
    return cmd + s.get("extra", "").split()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("suite", choices=[*SUITES, "all"])
    parser.add_argument("--results", type=Path, default=HERE / "results")
    parser.add_argument("--models", help="override the suite's comma-separated models")
    parser.add_argument("--ratios", help="override the suite's fast:slow ratios")
    parser.add_argument("--batch", type=int, help="override the suite's batch size")
    parser.add_argument("--solvers", default="cbc")
    parser.add_argument("--time-limit", type=float, default=600.0,
                        help="solver time limit per plan, seconds (best plan found is kept)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    args = parser.parse_args()
    suites = [s for s in SUITES if args.suite in (s, "all")]
    for suite in suites:
        cmd = command(suite, args)
        print(shlex.join(cmd), flush=True)
        if not args.dry_run:
            code = subprocess.call(cmd)
            if code:
                return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
