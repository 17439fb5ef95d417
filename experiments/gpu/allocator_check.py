"""Which caching-allocator settings let a plan fit its budget with the least headroom?

Every ILP plan at headroom 0 ran out of memory under the fair cap (docs/gpu.md): the allocator
needs more than the sum of live bytes. This runs headroom-0 plans under the cap with different
`PYTORCH_CUDA_ALLOC_CONF` settings, each in a fresh process (the settings are read when CUDA
starts), and reports for each whether it fit, the allocator's retries, the time, and at the end
(or at the out-of-memory error) how the reserved memory was split: allocated, free blocks, the
largest free block, and whether the segments were expandable.

Settings: ``runtime`` is what the executor does (expandable segments switched on through torch's
setter after start-up), ``runtime:CONF`` passes CONF to that setter instead (settings switched in
a running process); any other value is used as PYTORCH_CUDA_ALLOC_CONF with the executor's
setter switched off (``plain`` = no settings).

Usage (on the GPU machine):
  python3 experiments/gpu/allocator_check.py densenet264:32:1-1:async \
      --settings runtime plain expandable_segments:True
Cells are MODEL:BATCH:RATIO:STRATEGY[:dim=value]; results go to $OUT/allocator_check.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cells", nargs="+")
    parser.add_argument("--settings", nargs="+", default=["runtime", "plain"])
    parser.add_argument("--headroom", type=float, default=0.0)
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(check(args.cells[0], args.settings[0], args.headroom, args.iterations)))
        return
    rows = []
    for cell in args.cells:
        for setting in args.settings:
            rows.append(_in_fresh_process(cell, setting, args.headroom, args.iterations))
            print(_line(rows[-1]), flush=True)
    out = Path(os.environ.get("OUT", "/tmp")) / "allocator_check.json"
    out.write_text(json.dumps(rows, indent=1))


def _in_fresh_process(cell: str, setting: str, headroom: float, iterations: int) -> dict:
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if setting != "plain" and not setting.startswith("runtime"):
        env["PYTORCH_CUDA_ALLOC_CONF"] = setting
    done = subprocess.run([sys.executable, __file__, cell, "--settings", setting, "--headroom",
                           str(headroom), "--iterations", str(iterations), "--one"],
                          env=env, capture_output=True, text=True, timeout=300)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"cell": cell, "setting": setting, "error": done.stderr.strip()[-400:]}
    return json.loads(lines[-1])


def check(cell: str, setting: str, headroom: float, iterations: int) -> dict:
    import torch
    from diagnose import load_plan, parse_cell

    from autotm_py import api
    from autotm_py.errors import AutoTMError
    from autotm_py.options import DEFAULT_ALLOCATOR_SETTINGS

    # "runtime": the executor's own settings; "runtime:CONF": those; else the environment's
    settings = setting.removeprefix("runtime:") if setting.startswith("runtime:") else \
        DEFAULT_ALLOCATOR_SETTINGS if setting == "runtime" else None
    graph, plan = load_plan(*parse_cell(cell), headroom)
    row: dict = {"cell": cell, "setting": setting, "headroom": headroom,
                 "budget": plan.header.budget_bytes,
                 "modelled_peak": plan.header.counts.get("fast_peak_bytes")}
    try:
        run = api.execute(graph, plan, device="cuda", iterations=iterations, warmup=1,
                          allocator_settings=settings)
        row.update(fit=True, median_s=run.median_s, retries=run.alloc_retries,
                   peak=run.peak_fast_bytes)
    except AutoTMError as exc:
        row.update(fit=False, error=str(exc)[:200])
    row["max_reserved"] = torch.cuda.max_memory_reserved()
    try:
        row.update(_split_of_reserved(torch))
    except RuntimeError as exc:  # the cudaMallocAsync backend keeps no snapshot
        row["snapshot"] = str(exc)[:100]
    return row


def _split_of_reserved(torch) -> dict:
    """How the reserved memory is used now (after the run, or where it ran out)."""
    segments = torch.cuda.memory_snapshot()
    free = [b["size"] for s in segments for b in s["blocks"] if b["state"] == "inactive"]
    return {"reserved_now": sum(s["total_size"] for s in segments),
            "allocated_now": sum(s["allocated_size"] for s in segments),
            "segments": len(segments), "free_blocks": len(free),
            "largest_free": max(free, default=0),
            "expandable": sorted({bool(s.get("is_expandable")) for s in segments})}


def _line(row: dict) -> str:
    mib = 2**20
    head = f"{row['cell']:34s} {row['setting']:40s}"
    if "error" in row and "fit" not in row:
        return f"{head} crashed: {row['error'][-200:]}"
    verdict = (f"fit   {row['median_s'] * 1e3:7.1f} ms retries {row['retries']:4d}"
               if row["fit"] else "OOM" + " " * 27)
    line = (f"{head} {verdict} budget {row['budget'] / mib:6.0f} max-reserved "
            f"{row['max_reserved'] / mib:6.0f}")
    if "segments" not in row:
        return line
    return (f"{line} reserved {row['reserved_now'] / mib:6.0f} allocated "
            f"{row['allocated_now'] / mib:6.0f} free-blocks {row['free_blocks']:4d} largest "
            f"{row['largest_free'] / mib:5.0f} MiB expandable {row['expandable']}")


if __name__ == "__main__":
    main()
