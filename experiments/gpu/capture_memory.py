"""What holds memory when a plan runs out of it under its cap, or when a capture holds more than
the iteration's live peak?

`summarize(snapshot)`: torch's allocator snapshot in a few numbers: reserved and allocated bytes
by pool (the default pool, a CUDA graph's private pool), the free bytes stranded inside segments
(and the largest such block), the largest live blocks with the innermost frame of ours
(autotm_py) that allocated them, and live bytes summed per such frame.

`attach(out_dir)`: from then on, record allocation stacks (Python frames; slows the host) and
write `out_dir/oom_N.json`, the summary at the moment of every out-of-memory
(`experiments/gpu/arena_check.py --oom-snapshot` uses it).

This script runs carried plans at planned addresses (`--arena`, and replayed as a CUDA graph when
priced for replay) under their caps, or with `--model NAME` the model's all-fast plan on torch's
caching allocator and then replayed with static inputs (no arena, uncapped), and records the
summary at the first out-of-memory, right after the capture (what the captured iteration keeps)
and, for the eager run, at its end. Writes OUT/capture_memory.json.

    python3 experiments/gpu/capture_memory.py PLAN [PLAN...] [--out DIR] [--top 12] [--no-cap]
    python3 experiments/gpu/capture_memory.py --model densenet264 [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments" / "gpu"))

MIB = 2**20
OURS = "autotm_py"


def summarize(snapshot: dict[str, Any], requested: int | None = None,
              top: int = 20) -> dict[str, Any]:
    """The summary of a `torch.cuda.memory._snapshot()` (see the module's docstring)."""
    pools: dict[str, dict[str, int]] = {}
    live, free = [], []
    for segment in snapshot.get("segments", []):
        pool = pools.setdefault(_pool_name(segment), {"reserved": 0, "allocated": 0,
                                                      "segments": 0, "largest_segment": 0})
        pool["reserved"] += int(segment["total_size"])
        pool["allocated"] += int(segment["allocated_size"])
        pool["segments"] += 1
        pool["largest_segment"] = max(pool["largest_segment"], int(segment["total_size"]))
        for block in segment.get("blocks", []):
            if block["state"] == "active_allocated":
                live.append({"size": int(block["size"]),
                             "requested": int(block.get("requested_size", block["size"])),
                             "stream": segment.get("stream"), "where": where(block)})
            elif block["state"] == "inactive":
                free.append(int(block["size"]))
    live.sort(key=lambda b: -b["size"])
    by_where: Counter[str] = Counter()
    for block in live:
        by_where[block["where"]] += block["size"]
    return {"requested": requested,
            "reserved": sum(p["reserved"] for p in pools.values()),
            "allocated": sum(p["allocated"] for p in pools.values()),
            "pools": pools,
            "free_in_segments": {"bytes": sum(free), "largest": max(free, default=0),
                                 "blocks": len(free)},
            "largest_live": live[:top],
            "live_by_where": dict(by_where.most_common(top))}


def where(block: dict[str, Any]) -> str:
    """The innermost frame of ours that allocated `block` ("file:line function"), else the
    innermost frame, else "unknown" (no stacks recorded)."""
    frames = block.get("frames") or []
    ours = [f for f in frames if OURS in f.get("filename", "")]
    frame = (ours or frames or [None])[0]
    if frame is None:
        return "unknown"
    name = frame["filename"].rsplit(OURS + "/", 1)[-1]
    return f"{name}:{frame.get('line')} {frame.get('name')}"


def _pool_name(segment: dict[str, Any]) -> str:
    pool = tuple(segment.get("segment_pool_id") or (0, 0))
    return "default" if pool == (0, 0) else f"private {pool[0]},{pool[1]}"


_SEEN: list[dict] | None = None  # the summaries written so far, once an observer is attached


def attach(out_dir: Path, top: int = 20) -> list[dict]:
    """Record allocation stacks and write a summary at every out-of-memory (GPU only); the
    summaries are also appended to the list returned. Attaching again only turns the stacks
    back on (one observer per process)."""
    import torch

    global _SEEN
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.cuda.memory._record_memory_history(max_entries=200_000, stacks="python")
    if _SEEN is not None:
        return _SEEN
    seen = _SEEN = []

    def observer(device: int, requested: int, device_allocated: int, device_free: int) -> None:
        summary = summarize(torch.cuda.memory._snapshot(), requested, top)
        summary.update(device=device, device_allocated=device_allocated,
                       device_free=device_free)
        seen.append(summary)
        (out_dir / f"oom_{len(seen)}.json").write_text(json.dumps(summary, indent=1))

    torch._C._cuda_attach_out_of_memory_observer(observer)
    return seen


def run(graph, plan, name: str, top: int, *, cap: bool, arena: bool, replay: bool,
        out: Path) -> dict:
    import torch

    from autotm_py.options import Measure, RunMode
    from autotm_py.runtime.drivers import ReplayDriver
    from autotm_py.runtime.execute import execute

    row: dict = {"plan": name, "capped": cap, "arena": arena, "replayed": replay,
                 "budget_mib": (plan.header.budget_bytes or 0) / MIB}
    if plan.arena is not None:
        row |= {"arena_tensors_mib": plan.arena.scratch_offset / MIB,
                "arena_mib": plan.arena.nbytes / MIB}
    seen = attach(out / "oom", top)
    before = len(seen)
    captured = ReplayDriver.capture

    def capture_and_look(driver):  # what the captured iteration holds once captured
        failed = captured(driver)
        torch.cuda.synchronize()
        row["after_capture"] = summarize(torch.cuda.memory._snapshot(), top=top)
        return failed

    ReplayDriver.capture = capture_and_look
    try:
        # placed=False: the runtime's execute installs no placed allocator (as before)
        r = execute(graph, plan, device="cuda:0",
                    mode=RunMode(arena=arena, placed=False, replay=replay),
                    measure=Measure(iterations=2, warmup=2, capped=cap))
        row |= {"median_ms": r.median_s * 1e3, "graph": r.replayed, "notes": list(r.notes),
                "peak_mib": (r.peak_fast_bytes or 0) / MIB,
                "reserved_mib": (r.reserved_peak_bytes or 0) / MIB}
        # what the allocator still maps once the run's tensors are gone: the holes it kept
        row["at_end"] = summarize(torch.cuda.memory._snapshot(), top=top)
    except Exception as exc:
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
        ReplayDriver.capture = captured
    row["at_first_oom"] = seen[before] if len(seen) > before else None
    torch.cuda.empty_cache()
    print(json.dumps({k: v for k, v in row.items()
                      if k not in ("after_capture", "at_first_oom", "at_end")}), flush=True)
    return row


def main() -> int:
    from autotm_py.runtime.device import configure_cuda

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("plans", nargs="*", type=Path)
    parser.add_argument("--model", help="the all-fast plan of this zoo model, static inputs")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp")))
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--no-cap", action="store_true", help="run plans without the cap")
    args = parser.parse_args()
    configure_cuda(deterministic=False)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    if args.model:
        from native_compare import SHAPES  # the benchmark's shapes

        from autotm_py import api
        from autotm_py.pipeline import all_fast_plan
        batch, dims = SHAPES[args.model]
        graph = api.load_model(args.model, batch=batch, dims=dims or None, training=True)
        plan = all_fast_plan(graph)
        for replay in (False, True):
            rows.append(run(graph, plan, f"{args.model} all-fast", args.top, cap=False,
                            arena=False, replay=replay, out=args.out))
    for path in args.plans:
        from recompute_check import graph_of

        from autotm_py.plan import Plan
        plan = Plan.load(path)
        rows.append(run(graph_of(plan), plan, path.name, args.top, cap=not args.no_cap,
                        arena=True, replay=plan.header.run.replay, out=args.out))
    (args.out / "capture_memory.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
