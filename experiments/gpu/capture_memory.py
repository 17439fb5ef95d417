"""What holds memory when a plan at planned addresses runs out of it under its cap?

Runs a carried plan (`--arena`, and replayed as a CUDA graph when it was priced for replay) under
its cap with torch's allocation history on; at the first out-of-memory it takes an allocator
snapshot and sums the live blocks outside the arena by the innermost frame of autotm_py that
allocated them (kernel outputs that torch allocates, workspaces, the executor's own tensors),
and says which pool they sit in (the default pool, or a CUDA graph's private pool); the same
right after a capture (what the captured iteration keeps). Writes OUT/capture_memory.json.

    python3 experiments/gpu/capture_memory.py PLAN [PLAN...] [--out DIR] [--top 12] [--no-cap]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments" / "gpu"))

from recompute_check import graph_of  # noqa: E402

from autotm_py.plan import Plan  # noqa: E402
from autotm_py.runtime.device import configure_cuda  # noqa: E402
from autotm_py.runtime.executor import Executor, execute  # noqa: E402

MIB = 2**20


def where(frames: list[dict]) -> str:
    """The innermost frame in our code (file:line function), else the innermost Python one."""
    ours = [f for f in frames if "autotm_py" in f.get("filename", "")]
    f = (ours or frames or [{}])[0]
    return f"{Path(f.get('filename', '?')).name}:{f.get('line', '?')} {f.get('name', '?')}"


def live_blocks(snapshot: dict, arena_bytes: int, top: int) -> dict:
    """Blocks outside the arena by (pool, state), and the live ones by allocating frame."""
    by_site: dict[str, int] = defaultdict(int)
    by_pool: dict[str, int] = defaultdict(int)
    for seg in snapshot["segments"]:
        pool_id = tuple(seg.get("segment_pool_id") or (0, 0))
        pool = "default" if pool_id == (0, 0) else f"private {pool_id}"
        by_pool[f"{pool} reserved"] += seg["total_size"]
        for block in seg["blocks"]:
            if block["size"] == arena_bytes and block["state"] == "active_allocated":
                by_pool["arena"] += block["size"]
                continue
            by_pool[f"{pool} {block['state']}"] += block["size"]
            if block["state"] == "active_allocated":
                by_site[f"{pool}: {where(block.get('frames', []))}"] += block["size"]
    sites = sorted(by_site.items(), key=lambda kv: -kv[1])[:top]
    return {"by_pool_state_mib": {k: round(v / MIB, 1) for k, v in sorted(by_pool.items())},
            "live_by_site_mib": {k: round(v / MIB, 1) for k, v in sites}}


def run(path: Path, top: int, cap: bool) -> dict:
    plan = Plan.load(path)
    graph = graph_of(plan)
    replay = bool(plan.header.config.get("graph"))
    arena_bytes = plan.arena.scratch_offset if plan.arena is not None else -1
    seen: list[dict] = []
    row: dict = {}

    def observer(device, alloc, device_allocated, device_free):
        if not seen:
            seen.append({"request_mib": alloc / MIB, "allocated_mib": device_allocated / MIB,
                         **live_blocks(torch.cuda.memory._snapshot(), arena_bytes, top)})

    torch.cuda.memory._record_memory_history(max_entries=200000, stacks="python")
    torch._C._cuda_attach_out_of_memory_observer(observer)
    captured = Executor.capture

    def capture_and_look(executor):  # what the captured iteration holds once captured
        failed = captured(executor)
        torch.cuda.synchronize()
        row["after_capture"] = live_blocks(torch.cuda.memory._snapshot(), arena_bytes, top)
        return failed

    Executor.capture = capture_and_look
    row |= {"plan": path.name, "budget_mib": plan.header.budget_bytes / MIB, "capped": cap,
            "arena_tensors_mib": arena_bytes / MIB,
            "arena_mib": (plan.arena.nbytes if plan.arena else 0) / MIB}
    try:
        r = execute(graph, plan, device="cuda:0", iterations=2, warmup=2, arena=True,
                    graph_replay=replay, enforce_budget=cap)
        row |= {"median_ms": r.median_s * 1e3, "graph": r.graph, "notes": list(r.notes),
                "peak_mib": (r.peak_fast_bytes or 0) / MIB}
    except Exception as exc:
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    torch.cuda.memory._record_memory_history(enabled=None)
    Executor.capture = captured
    row["at_first_oom"] = seen[0] if seen else None
    torch.cuda.empty_cache()
    print(json.dumps(row, indent=1), flush=True)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("plans", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp")))
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--no-cap", action="store_true", help="run without the cap")
    args = parser.parse_args()
    configure_cuda(deterministic=False)
    rows = [run(p, args.top, not args.no_cap) for p in args.plans]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "capture_memory.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
