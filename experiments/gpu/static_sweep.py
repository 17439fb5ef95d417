"""Capped CUDA-graph replays with static inputs, each attempt in a process of its own.

For every model and budget among the plans in PLANS named MODEL_RATIO_async+recompute_graph_hH
(`GRAPH=1 plan_recompute.sh`), run `autotm run --replay` under the plan's cap in increasing
headroom until one replays with no allocator retries (a capture that does not fit the cap falls
back to eager iterations or runs out of memory: the next headroom). One process per attempt, as
a user runs `autotm run`, so that nothing an attempt leaves behind meets the next one's cap.
Appends one JSON line per attempt to OUT/static_sweep.jsonl.

    python3 experiments/gpu/static_sweep.py OUT [--plans experiments/plans/recompute_2026-11-27]
        [--models resnet200,densenet264] [--iterations 5]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"^(?P<model>.+)_(?P<ratio>\d+-\d+)_async\+recompute_graph_h(?P<h>[\d.]+)\.json")
# the run's result fields kept; "graph" (whether it replayed) is the result's "replayed"
KEYS = ("median_s", "graph", "alloc_retries", "budget_bytes", "cap_bytes", "peak_fast_bytes",
        "reserved_peak_bytes", "capture_reserved_bytes", "predicted_time_s", "notes")
RENAMED = {"graph": "replayed"}


def attempts(plans: Path, models: list[str]) -> dict[tuple[str, str], list[tuple[float, Path]]]:
    found: dict[tuple[str, str], list[tuple[float, Path]]] = defaultdict(list)
    for path in sorted(plans.glob("*_async+recompute_graph_h*.json*")):
        m = NAME.match(path.name)
        if m and m["model"] in models:
            found[(m["model"], m["ratio"])].append((float(m["h"]), path))
    return {k: sorted(v) for k, v in sorted(found.items())}


def run(model: str, plan: Path, iterations: int) -> dict:
    proc = subprocess.run([sys.executable, "-m", "autotm_py", "run", model, "--plan", str(plan),
                           "--device", "cuda", "--replay", "--iterations", str(iterations),
                           "--json"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    if proc.returncode:
        return {"error": (proc.stderr.strip().splitlines() or ["?"])[-1][:300]}
    doc = json.loads(proc.stdout)
    result = doc.get("result", doc)
    return {k: result.get(RENAMED.get(k, k)) for k in KEYS}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--plans", type=Path,
                        default=ROOT / "experiments/plans/recompute_2026-11-27")
    parser.add_argument("--models", default="resnet200,densenet264,inception_v4")
    parser.add_argument("--iterations", type=int, default=5)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "static_sweep.jsonl").open("a") as log:
        for (model, ratio), plans in attempts(args.plans, args.models.split(",")).items():
            for headroom, path in plans:
                row = {"model": model, "ratio": ratio, "headroom": headroom,
                       "plan": path.name, **run(model, path, args.iterations)}
                log.write(json.dumps(row) + "\n")
                log.flush()
                print(f"{model} {ratio} h{headroom}: " + (row.get("error") or (
                    f"{row['median_s'] * 1e3:.1f} ms, replayed {row['graph']}, retries "
                    f"{row['alloc_retries']}, predicted {row['predicted_time_s'] * 1e3:.1f}, "
                    f"reserved {row['reserved_peak_bytes'] / 2**20:.0f} of cap "
                    f"{row['cap_bytes'] / 2**20:.0f} MiB")), flush=True)
                if "error" not in row and row["graph"] and not row["alloc_retries"]:
                    break
    return 0


if __name__ == "__main__":
    sys.exit(main())
