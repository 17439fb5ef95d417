"""The value facts on a GPU (docs/values.md): the masked stack of fill_demo.py (12 layers,
2048 x 512, its mask all zeros) at a 12 MiB budget, planned with and without the fact that
the mask is zero, then checked and timed on CUDA.

    python3 experiments/values/fill_gpu.py plan DIR     # here: solve both plans (H200 pricing)
    python3 experiments/values/fill_gpu.py check DIR    # GPU: value profile on cuda; both
                                                        # plans' outputs equal (3 steps)
    python3 experiments/values/fill_gpu.py time DIR plain|fills   # GPU: one plan's median
                                                        # (50 iterations after 5), replayed

Each `time` runs in a process of its own (the placed allocator is installed before CUDA
starts); DIR holds plain.json and fills.json (carry it to the GPU machine).
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fill_demo import masked_stack

from autotm_py import api
from autotm_py.config import PlanConfig
from autotm_py.options import Measure
from autotm_py.plan import Plan

PLANS = {"plain": (), "fills": (("mask", 0.0),)}


def plan(out: Path) -> None:
    g = masked_stack(12, 2048, 512)
    costs = api.load_costs(g, device="cuda", gpu="h200")
    out.mkdir(parents=True, exist_ok=True)
    for name, fills in PLANS.items():
        res = api.optimize(g, PlanConfig(fast_mem_bytes=3 * 2048 * 512 * 4, reserve_bytes=0,
                                         gpu="h200", time_limit_s=120, fills=fills),
                           costs=costs)
        res.plan.save(str(out / f"{name}.json"))
        print(name, res.status, res.predicted_time_s, dict(res.plan.header.counts))


def check(plans: Path) -> None:
    import torch

    from autotm_py.runtime.execute import run_steps

    g = masked_stack(12, 2048, 512)
    doc = api.profile_values(g, device="cuda", iterations=3)
    print("profile on cuda:", {r["name"]: r["class"] for r in doc["tensors"]
                               if r["class"] != "varied"}, "fills", api.value_fills(doc))
    outs = []
    for name in PLANS:
        p = Plan.load(str(plans / f"{name}.json"))
        outs.append(run_steps(g, p, steps=3, device="cuda", mode=p.header.run))
    same = all(torch.equal(a[t], b[t]) for a, b in zip(*outs, strict=True) for t in a)
    print("outputs equal on cuda (arena + replay, 3 steps):", same)


def time(plans: Path, name: str) -> None:
    g = masked_stack(12, 2048, 512)
    p = Plan.load(str(plans / f"{name}.json"))
    api.prepare_cuda_process(p, "cuda", p.header.run)
    costs = api.load_costs(g, device="cuda", gpu="h200")
    r = api.execute(g, p, device="cuda", mode=p.header.run, costs=costs,
                    measure=Measure(iterations=50, warmup=5))
    print(json.dumps({"plan": name, "median_ms": r.median_s * 1e3,
                      "predicted_ms": (r.predicted_time_s or 0) * 1e3,
                      "peak_fast": r.peak_fast_bytes, "budget": r.budget_bytes,
                      "replayed": r.replayed, "notes": list(r.notes)}))


if __name__ == "__main__":
    what, where = sys.argv[1], Path(sys.argv[2])
    {"plan": lambda: plan(where), "check": lambda: check(where),
     "time": lambda: time(where, sys.argv[3])}[what]()
