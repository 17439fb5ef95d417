"""Where copies and launches come from in one training iteration of our kernels, per IR op.

Runs every kernel of the training graph in order (as the all-fast executor does, one
`run_kernel` each) inside a profiler range named after its op type, then attributes every
`aten::copy_` / `aten::clone` / `aten::_to_copy` to the range it ran in, with its device time
(CUDA) and the aten op directly above it (`clone` of a kernel output made contiguous by
`run_kernel`, a `clone` inside a functional op, a bias broadcast inside `addmm`...). Also counts
the aten ops each IR op type dispatches (views aside), i.e. its launches.

    python3 experiments/gpu/copy_sources.py OUT.json [--models resnet200,bert_base]
        [--device cuda] [--small] [--no-fuse]

Prints a table per model and writes OUT.json. `--small` uses tiny shapes (a smoke test on the
CPU; its times mean nothing).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from autotm_py import api  # noqa: E402
from autotm_py.kernels import run_kernel  # noqa: E402
from autotm_py.runtime.reference import init_values  # noqa: E402

SHAPES = {"resnet200": (32, {}), "densenet264": (32, {}),
          "bert_base": (16, {"seq": 512}), "gpt2_small": (8, {"seq": 512})}
SMALL = {"resnet200": (1, {}), "densenet264": (1, {}),
         "bert_base": (1, {"seq": 16}), "gpt2_small": (1, {"seq": 16})}
COPIES = ("aten::copy_", "aten::clone", "aten::_to_copy")
VIEWS = {"aten::view", "aten::_unsafe_view", "aten::reshape", "aten::t", "aten::transpose",
         "aten::permute", "aten::expand", "aten::alias", "aten::unsqueeze", "aten::squeeze",
         "aten::slice", "aten::select", "aten::as_strided", "aten::detach", "aten::split",
         "aten::split_with_sizes", "aten::empty", "aten::empty_like", "aten::new_empty",
         "aten::empty_strided", "aten::resize_", "aten::contiguous"}
RANGE = "autotm-op:"


def iteration(graph, values: dict, ranges: bool) -> None:
    """One pass over the kernels, dropping each tensor after its last reader."""
    last = {t: r[1] for t, r in enumerate(graph.live_ranges)}
    live = dict(values)
    for k in graph.kernels:
        args = [live[t] for t in k.inputs]
        if ranges:
            with torch.profiler.record_function(RANGE + k.op_type):
                outs = run_kernel(k, args)
        else:
            outs = run_kernel(k, args)
        live.update(zip(k.outputs, outs, strict=True))
        for t in set(k.inputs):
            if last[t] == k.id and t not in values:
                del live[t]


def _range_of(event) -> str:
    p = event.cpu_parent
    while p is not None and not p.name.startswith(RANGE):
        p = p.cpu_parent
    return p.name[len(RANGE):] if p is not None else "?"


def profile(name: str, batch: int, dims: dict, device: str, fuse: bool) -> dict:
    graph = api.load_model(name, batch=batch, dims=dims or None, training=True, fuse=fuse)
    values = {t: v.to(device) for t, v in init_values(graph, seed=0).items()}
    with torch.no_grad():
        iteration(graph, values, ranges=False)  # warm-up (cuDNN/cuBLAS plans)
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.startswith("cuda"):
            activities.append(torch.profiler.ProfilerActivity.CUDA)
            torch.cuda.synchronize()
        with torch.profiler.profile(activities=activities) as prof:
            iteration(graph, values, ranges=True)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
    copies: dict[tuple[str, str, str], list[float]] = defaultdict(lambda: [0, 0.0])
    launches: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for e in prof.events():
        if not e.name.startswith("aten::"):
            continue
        op = _range_of(e)
        parent = e.cpu_parent.name if e.cpu_parent is not None else "?"
        if e.name in COPIES:
            row = copies[(op, e.name, parent)]
            row[0] += 1
            row[1] += e.self_device_time_total / 1e3  # ms
        if parent.startswith(RANGE) and e.name not in VIEWS:
            launches[op][e.name] += 1
    kernels = defaultdict(int)
    for k in graph.kernels:
        kernels[k.op_type] += 1
    return {
        "model": name, "batch": batch, "dims": dims, "device": device, "fused": fuse,
        "kernels": len(graph.kernels),
        "copies": [{"op": op, "copy": c, "inside": p, "count": n, "device_ms": round(ms, 3)}
                   for (op, c, p), (n, ms) in sorted(copies.items(), key=lambda x: -x[1][1])],
        "aten_per_kernel": {op: {a: n / kernels[op] for a, n in sorted(ops.items())}
                            for op, ops in sorted(launches.items())},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--models", default="resnet200,bert_base")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--no-fuse", action="store_true")
    a = ap.parse_args()
    rows = []
    for name in a.models.split(","):
        batch, dims = (SMALL if a.small else SHAPES)[name]
        row = profile(name, batch, dims, a.device, not a.no_fuse)
        rows.append(row)
        print(f"\n{name} b{batch} {dims or ''} on {a.device}: {row['kernels']} kernels")
        for c in row["copies"]:
            print(f"  {c['count']:5d} x {c['copy']:15s} in {c['op']:32s} (inside "
                  f"{c['inside']}) {c['device_ms']:8.3f} ms")
    Path(a.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
