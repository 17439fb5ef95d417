"""Value-aware planning on a model where it changes the plan (docs/values.md, "Effect").

A stack of LAYERS blocks h <- Relu(MatMul(h, W_l) + mask), every block adding the same
additive mask, as the layers of an encoder add one attention mask (here all zeros: no
padding). The mask lives from the first block to the last, so under a tight budget a plain
plan writes it out once and reads it back before blocks; with the value profile's facts the
planner drops it and fills it again instead. Steps: profile the values on the CPU (2
iterations, seeded random weights), plan twice at the same budget (GPU mode, h100-pcie5 link,
kernel times estimated by the roofline model: no profiles exist for this graph), simulate
both, and run both plans on the CPU to check that they give the same outputs.

    python experiments/values/fill_demo.py [--layers 12] [--rows 2048] [--width 512]
        [--budget-acts 3] [--no-arena] [-o numbers.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch

from autotm_py import api
from autotm_py.config import PlanConfig
from autotm_py.ir import GraphBuilder, Role
from autotm_py.options import RunMode
from autotm_py.plan import Fill, Move
from autotm_py.runtime.execute import run_steps
from autotm_py.units import format_bytes


def masked_stack(layers: int, rows: int, width: int):
    b = GraphBuilder(f"masked_stack{layers}")
    h = b.add_tensor("x", (rows, width), "float32", Role.INPUT)
    b.inputs.append(h)
    mask = b.add_constant("mask", np.zeros((rows, width), dtype=np.float32))
    for i in range(layers):
        w = b.add_tensor(f"w{i}", (width, width), "float32", Role.WEIGHT)
        a, s, r = (b.add_tensor(f"{n}{i}", (rows, width), "float32", Role.ACTIVATION)
                   for n in ("mm", "masked", "h"))
        b.add_kernel("MatMul", [h, w], [a])
        b.add_kernel("Add", [a, mask], [s])
        b.add_kernel("Relu", [s], [r])
        h = r
    b.outputs.append(h)
    return b.build()


def summary(graph, result, sim) -> dict:
    counts = result.plan.header.counts
    moved = {k: v for k, v in sim.bytes_moved.items()}
    mask = graph.tensor_ids_by_name["mask"]
    return {"status": result.status, "predicted_ms": sim.total_s * 1e3,
            "moved_bytes": sum(moved.values()), "moved": moved,
            "mask_moves": sum(1 for r in result.plan.records
                              if isinstance(r, Move) and r.tensor == mask),
            "fills": sum(1 for r in result.plan.records if isinstance(r, Fill)),
            "filled_bytes": sim.filled_bytes, "fast_peak": sim.fast_peak_bytes,
            "recomputes": int(counts.get("recomputes", 0))}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--budget-acts", type=float, default=3.0,
                    help="budget in activations (rows x width x 4 bytes)")
    ap.add_argument("--no-arena", action="store_true",
                    help="plan for torch's caching allocator (no arena at planned offsets)")
    ap.add_argument("-o", "--output", default=None, help="write the numbers here (JSON)")
    args = ap.parse_args(argv)
    graph = masked_stack(args.layers, args.rows, args.width)
    started = time.perf_counter()
    profile = api.profile_values(graph, device="cpu", iterations=2)
    facts = api.value_fills(profile)
    print(f"values: {facts} ({time.perf_counter() - started:.1f} s)")
    costs = api.load_costs(graph, device="cuda")
    budget = int(args.budget_acts * args.rows * args.width * 4)
    rows, outputs = {}, []
    for name, fills in (("plain", ()), ("with --values", facts)):
        config = PlanConfig(fast_mem_bytes=budget, reserve_bytes=0, time_limit_s=120,
                            fills=fills, run=RunMode() if args.no_arena else None)
        result = api.optimize(graph, config, costs=costs)
        sim = api.simulate(graph, result.plan, costs=costs)
        rows[name] = summary(graph, result, sim)
        outputs.append(run_steps(graph, result.plan, steps=2, device="cpu",
                                 mode=result.plan.header.run.on("cpu")))
    same = all(torch.equal(a[t], b[t]) for a, b in zip(*outputs, strict=True) for t in a)
    print(f"{graph.name}: {len(graph.kernels)} kernels, budget {format_bytes(budget)}, "
          f"all-fast {costs.total_s * 1e3:.3f} ms (roofline estimates, h100-pcie5)")
    for name, r in rows.items():
        print(f"{name:<14} predicted {r['predicted_ms']:.3f} ms, moved "
              f"{format_bytes(r['moved_bytes'])} ({r['mask_moves']} moves of the mask), "
              f"{r['fills']} fills ({format_bytes(r['filled_bytes'])}), "
              f"{r['recomputes']} re-runs")
    print(f"outputs equal on the CPU (2 iterations): {same}")
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            json.dump({"model": graph.name, "budget_bytes": budget, "rows": rows,
                       "outputs_equal": same, "facts": facts}, f, indent=1)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
