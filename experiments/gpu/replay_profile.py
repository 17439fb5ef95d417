"""Where does a replayed iteration lose time against the same plan run eagerly?

Moving plans at planned addresses run 4-9% slower replayed as CUDA graphs than predicted, and
the transformers' replays are slower than their eager runs (docs/gpu.md, 2026-11-27), while a
miniature of the executor's copy pattern runs as fast in a graph as eagerly
(graph_copy_probe.py). This runs one plan at planned addresses (uncapped), profiles one eager
iteration and one replay with the torch profiler (CUPTI traces the kernels and copies of a
graph too), and compares, per run: the span, each stream's busy time (union of its intervals),
the compute stream's idle time inside the span, the copies per direction (count, total time,
median duration), how long both directions copy at once and how long copies run beside
kernels, and the kernels whose summed time differs most. (A replay's nodes run on the graph's
own internal streams, so its "compute stream" is the busiest of those.)

    python3 experiments/gpu/replay_profile.py PLAN [PLAN...] [--out DIR] [--top 12]

Writes OUT/replay_profile.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments" / "gpu"))

from autotm_py.runtime.device_trace import union_length as union  # noqa: E402

COPIES = {"Memcpy HtoD": "h2d", "Memcpy DtoH": "d2h", "Memcpy DtoD": "d2d", "Memset": "memset"}


def kind(name: str) -> str:
    return next((v for k, v in COPIES.items() if name.startswith(k)), "kernel")


def summarize(events: list[dict], top_names: int = 0) -> dict:
    """Span, per-stream busy time and the copies of one profiled iteration (ns -> ms)."""
    if not events:
        return {"events": 0}
    begin = min(e["start"] for e in events)
    end = max(e["start"] + e["dur"] for e in events)
    streams: dict[int, list[tuple[int, int]]] = defaultdict(list)
    kinds: dict[str, list[int]] = defaultdict(list)
    by_name: dict[str, int] = defaultdict(int)
    compute_votes: dict[int, int] = defaultdict(int)
    for e in events:
        streams[e["stream"]].append((e["start"], e["start"] + e["dur"]))
        kinds[kind(e["name"])].append(e["dur"])
        by_name[e["name"]] += e["dur"]
        if kind(e["name"]) == "kernel":
            compute_votes[e["stream"]] += 1
    compute = max(compute_votes, key=compute_votes.get) if compute_votes else None
    span = end - begin
    busy = {str(s): union(iv) / 1e6 for s, iv in streams.items()}
    out = {"events": len(events), "span_ms": span / 1e6, "compute_stream": compute,
           "busy_ms": busy,
           "compute_idle_ms": (span - union(streams[compute])) / 1e6 if compute is not None
           else None,
           "by_kind": {k: {"count": len(v), "total_ms": sum(v) / 1e6,
                           "median_us": statistics.median(v) / 1e3} for k, v in kinds.items()}}
    out["copies_ms"] = copy_overlaps(events)
    out["by_name_ms"] = {k: v / 1e6 for k, v in by_name.items()}
    return out


def copy_overlaps(events: list[dict]) -> dict[str, float]:
    """How long each direction copies (union of its intervals), how long both directions copy
    at once (each then gets a share of the link), and how long copies run beside kernels."""
    spans: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for e in events:
        spans[kind(e["name"])].append((e["start"], e["start"] + e["dur"]))
    up, down, kernels = (union(spans[k]) for k in ("h2d", "d2h", "kernel"))
    both = up + down - union(spans["h2d"] + spans["d2h"])
    copying = union(spans["h2d"] + spans["d2h"])
    beside = copying + kernels - union(spans["h2d"] + spans["d2h"] + spans["kernel"])
    return {"h2d": up / 1e6, "d2h": down / 1e6, "both_directions": both / 1e6,
            "any_direction": copying / 1e6, "copies_beside_kernels": beside / 1e6}


def gpu_events(prof) -> list[dict]:
    """The device-side events (kernels, copies, memsets) of a finished profile."""
    out = []
    for e in prof.profiler.kineto_results.events():
        if e.device_type() != torch.autograd.DeviceType.CUDA:
            continue
        out.append({"name": e.name(), "start": int(e.start_ns()), "dur": int(e.duration_ns()),
                    "stream": int(e.device_resource_id())})
    return out


def profiled(step) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    return gpu_events(prof)


def differences(eager: dict, replay: dict, top: int) -> list[dict]:
    a, b = eager.get("by_name_ms", {}), replay.get("by_name_ms", {})
    rows = [{"name": n[:120], "eager_ms": a.get(n, 0.0), "replay_ms": b.get(n, 0.0)}
            for n in set(a) | set(b)]
    rows.sort(key=lambda r: -abs(r["replay_ms"] - r["eager_ms"]))
    return rows[:top]


def run(path: Path, top: int) -> dict:
    from recompute_check import graph_of

    from autotm_py.plan import Plan
    from autotm_py.runtime.device import release_blas_workspaces
    from autotm_py.runtime.executor import new_executor

    plan = Plan.load(path)
    graph = graph_of(plan)
    _, executor = new_executor(graph, plan, "cuda:0", arena=plan.arena is not None)
    for _ in range(2):
        executor.prepare()
        executor.run()
    executor.prepare()
    eager = summarize(profiled(executor.run))
    release_blas_workspaces(executor.device)
    executor.warm_up()
    failed = executor.capture()
    if failed is not None:
        return {"plan": path.name, "error": f"capture failed at {failed}"}
    for _ in range(2):
        executor.prepare()
        executor.replay()
    executor.prepare()
    replay = summarize(profiled(executor.replay))
    row = {"plan": path.name, "eager": eager, "replay": replay,
           "largest_differences": differences(eager, replay, top)}
    for part in (eager, replay):
        part.pop("by_name_ms", None)
    print(json.dumps({"plan": path.name,
                      **{k: {x: part.get(x) for x in ("span_ms", "copies_ms", "by_kind")}
                         for k, part in (("eager", eager), ("replay", replay))}}), flush=True)
    return row


def main() -> int:
    from autotm_py.runtime.device import configure_cuda

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("plans", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp")))
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    configure_cuda(deterministic=False)
    rows = []
    for path in args.plans:
        try:
            rows.append(run(path, args.top))
        except Exception as exc:  # keep the other plans' rows
            rows.append({"plan": path.name, "error": f"{type(exc).__name__}: {exc}"})
            print(rows[-1], flush=True)
        torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "replay_profile.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
