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

    python3 experiments/gpu/replay_profile.py PLAN [PLAN...] [--out DIR] [--top 12] [--copies]

Both iterations run in this process, under the work queues the environment gives it
(`CUDA_DEVICE_MAX_CONNECTIONS`; unset, CUDA's 8, under which a replay's copies ran 9-14% slower
than eager ones; set it to 1 to profile what `autotm run --replay` runs: docs/gpu.md, "Copies in
a replay: the work queues").

Writes OUT/replay_profile.json. With --copies, each row also gets `per_copy`: the plan's copies
matched one to one between the eager iteration and the replay (the k-th copy of a direction in
time order is the k-th move in that direction in the plan), each with its bytes, its host and
device offsets modulo 4096, both durations and the replay's internal stream, and the median
replay/eager ratio grouped by those (is the slowdown uniform, or tied to sizes, alignments or
to the streams the graph runs its copies on?).
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


def copy_events(events: list[dict], direction: str) -> list[dict]:
    return sorted((e for e in events if kind(e["name"]) == direction), key=lambda e: e["start"])


def plan_moves(plan, graph) -> dict[str, list[dict]]:
    """The plan's moves by direction ("h2d", "d2h"), in record order, with what might decide a
    copy's speed: its bytes and where its two ends lie (host pool offset, arena offset)."""
    from autotm_py.memory.tiers import FAST
    from autotm_py.plan import INITIAL, Move
    from autotm_py.runtime.pinned import slow_tier_layout

    host, _ = slow_tier_layout(graph, plan)
    created: dict[int, dict[int, int]] = defaultdict(dict)  # record -> tensor -> offset
    for (index, tid), offset in (plan.arena.offsets() if plan.arena is not None else {}).items():
        created[index][tid] = offset
    fast_at = dict(created[INITIAL])  # where each tensor's fast copy is now
    out: dict[str, list[dict]] = {"h2d": [], "d2h": []}
    for index, rec in enumerate(plan.records):
        fast_at.update(created.get(index, {}))
        if not isinstance(rec, Move):
            continue
        out["h2d" if rec.to == FAST else "d2h"].append({
            "bytes": graph.tensors[rec.tensor].nbytes, "mode": rec.mode,
            "host_mod_4096": host.get(rec.tensor, -1) % 4096,
            "device_mod_4096": fast_at.get(rec.tensor, -1) % 4096})
    return out


def per_copy(plan, graph, eager: list[dict], replay: list[dict]) -> dict:
    """Each copy's replay/eager ratio beside what might explain it (see the module docstring)."""
    out: dict = {}
    for direction, moves in plan_moves(plan, graph).items():
        a, b = copy_events(eager, direction), copy_events(replay, direction)
        if not (len(a) == len(b) == len(moves)):
            out[direction] = {"unmatched": [len(a), len(b), len(moves)]}
            continue
        rows = [{**m, "eager_us": x["dur"] / 1e3, "replay_us": y["dur"] / 1e3,
                 "stream": y["stream"], "ratio": y["dur"] / max(x["dur"], 1)}
                for m, x, y in zip(moves, a, b, strict=True)]
        out[direction] = {"copies": rows, "by": {key: grouped(rows, key) for key in (
            "mode", "host_mod_4096", "device_mod_4096", "size", "stream")}}
    return out


def size_bucket(nbytes: int) -> str:
    """The power of 4 MiB above `nbytes`: '<1 MiB', '<4 MiB', '<16 MiB', ..."""
    mib = 1
    while nbytes >= mib << 20:
        mib *= 4
    return f"<{mib} MiB"


def grouped(rows: list[dict], key: str, most: int = 12) -> dict[str, list[float]]:
    """[count, median ratio, GB/s eager, GB/s replayed] per value of `key` (size: a power-of-4
    bucket of MiB), the `most` largest groups."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        groups[str(r[key] if key != "size" else size_bucket(r["bytes"]))].append(r)
    largest = sorted(groups.items(), key=lambda kv: -len(kv[1]))[:most]
    return {k: [len(v), round(statistics.median(r["ratio"] for r in v), 4),
                round(sum(r["bytes"] for r in v) / sum(r["eager_us"] for r in v) / 1e3, 2),
                round(sum(r["bytes"] for r in v) / sum(r["replay_us"] for r in v) / 1e3, 2)]
            for k, v in largest}


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


def run(path: Path, top: int, copies: bool = False) -> dict:
    from recompute_check import graph_of

    from autotm_py.options import RunMode
    from autotm_py.plan import Plan
    from autotm_py.runtime.device import release_blas_workspaces
    from autotm_py.runtime.drivers import ReplayDriver
    from autotm_py.runtime.execute import new_executor

    plan = Plan.load(path)
    graph = graph_of(plan)
    # the eager iterations first, then a replay driver over the same executor (no static
    # inputs without an arena: the executor is the eager one's)
    _, executor, _ = new_executor(graph, plan, "cuda:0",
                                  mode=RunMode(arena=plan.arena is not None))
    driver = ReplayDriver(executor)
    for _ in range(2):
        executor.prepare()
        executor.run()
    executor.prepare()
    eager_events = profiled(executor.run)
    eager = summarize(eager_events)
    release_blas_workspaces(executor.device)
    driver.warm_up()
    failed = driver.capture()
    if failed is not None:
        return {"plan": path.name, "error": f"capture failed at {failed}"}
    for _ in range(2):
        executor.prepare()
        driver.replay()
    executor.prepare()
    replay_events = profiled(driver.replay)
    replay = summarize(replay_events)
    row = {"plan": path.name, "eager": eager, "replay": replay,
           "largest_differences": differences(eager, replay, top)}
    if copies:
        row["per_copy"] = per_copy(plan, graph, eager_events, replay_events)
        print(json.dumps({d: v.get("by", v) for d, v in row["per_copy"].items()}), flush=True)
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
    parser.add_argument("--copies", action="store_true",
                        help="match each copy between eager and replay (module docstring)")
    args = parser.parse_args()
    configure_cuda(deterministic=False)
    rows = []
    for path in args.plans:
        try:
            rows.append(run(path, args.top, args.copies))
        except Exception as exc:  # keep the other plans' rows
            rows.append({"plan": path.name, "error": f"{type(exc).__name__}: {exc}"})
            print(rows[-1], flush=True)
        torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "replay_profile.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
