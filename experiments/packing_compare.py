"""How tightly each packing packs the plans the arena's fit loop meets (docs/planning.md, "The
skyline packing"): every case is planned as `autotm optimize` plans it in GPU mode (H200
profiles, an arena, the fit loop), and the buffers of every plan the fit loop packs are packed
again by greedy by size (`arena.packing.greedy_by_size`, its four variants), by best fit on the
skyline (`skyline`) and by the whole search (`tightest_packing`, no limit); each is reported as
its share above the plan's live peak, which no packing can beat.

    python3 experiments/packing_compare.py OUT.json [--case gpt3b,resnet200,...]

Cases (each plans for one to five minutes on a 2-core machine):
- gpt3b: the zoo's GPT decoder of issue 49 (28 layers, d=3072, sequence 2048, batch 4; the
  form of experiments/plan_scale.py), bf16, Adam, under 24 GiB, `--time-limit 150`;
- resnet200: ResNet-200 b64, bf16, channels-last, at 25% of its peak (60 s);
- inception_v4: Inception-v4 b64, fp32, at 33% (60 s);
- resnet50: ResNet-50 b32, fp32, at 1:3 (60 s);
- vgg19: VGG19 b64, fp32, at 86% (60 s);
- unet: the exported corpus's U-Net at its GPU size (models/corpus/make_corpus.py --scale gpu),
  fp32, convolution gradients split, at 55% and 53% of its split graph's peak (30 s), the
  budgets of experiments/results/corpus/2026-12-03-split/;
- trainer6, trainer10: the Trainer's capture of experiments/gpu/beyond_card.py's decoder cut to
  6 or 10 layers (d=3072, sequence 2048, batch 4, bf16, AdamW, the loss in 16 blocks), under 8
  or 12 GiB (100 s); the capture of 6 layers holds about 11.5 GB of host memory.
Each row lists every packing asked for (the fit loop's solves, then the neighbourhood search's
plan), the plan's predicted time and its arena notes.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))
sys.path.insert(0, str(ROOT / "experiments" / "gpu"))

from autotm_py import api, arena, pipeline  # noqa: E402
from autotm_py.arena import packing  # noqa: E402
from autotm_py.config import PlanConfig  # noqa: E402
from autotm_py.options import default_run_mode  # noqa: E402

UNET_BUDGETS = (1768074213, 1703780605)  # 55% and 53% of the split U-Net's peak
# the Trainer's decoder cut to this many layers, under this budget (6 layers need 6.97 GiB:
# the tied embedding's Adam update alone holds 6.90)
TRAINER_CUTS = {"trainer6": (6, 8 << 30), "trainer10": (10, 12 << 30)}


@dataclass(frozen=True)
class Case:
    budget: str | float | int  # a ratio, a share of the peak, or bytes
    time_limit_s: float
    layout: bool = True  # channels-last where the H200's profiles have it (optimize's default)


def zoo_graph(name: str, batch: int, precision: str, optimizer: str) -> Any:
    return api.load_model(name, training=True, optimizer=optimizer, precision=precision,
                          batch=batch)


def gpt3b_graph(folder: Path) -> Any:
    import plan_scale

    args = argparse.Namespace(layers=28, d=3072, heads=24, vocab=50257, seq=2048, batch=4)
    path = plan_scale.export(args, folder)
    return api.load_model(str(path), training=True, optimizer="adam", precision="bf16")


def unet_graph(folder: Path) -> Any:
    import subprocess

    subprocess.run([sys.executable, str(ROOT / "models" / "corpus" / "make_corpus.py"), "--out",
                    str(folder), "--scale", "gpu", "--only", "unet_small"], check=True,
                   capture_output=True)
    graph = api.load_model(str(folder / "unet_small.onnx"), training=True, precision="fp32")
    return api.split_conv_grads(graph)


def trainer_graph(layers: int) -> Any:
    """The Trainer's training graph of beyond_card.py's decoder cut to `layers` layers."""
    import torch
    from trainer_bench import GPT2

    from autotm_py.frontend.capture import capture_module
    from autotm_py.frontend.onnx import import_model
    from autotm_py.ir.precision import with_precision
    from autotm_py.ir.training import derive_training
    from autotm_py.trainer.spec import optimizer_of

    torch.manual_seed(0)
    net = GPT2(vocab=50257, dim=3072, layers=layers, heads=24, seq=2048)
    tokens = torch.randint(0, 50257, (4, 2048))
    spec = optimizer_of(torch.optim.AdamW(net.parameters(), lr=1e-4, weight_decay=0.1),
                        list(net.parameters()))
    captured = capture_module(net, (tokens,))
    forward = with_precision(import_model(captured.model, name="GPT2",
                                          initializer_weights=True), "bf16")
    return derive_training(forward, optimizer=spec, loss="ce-last", loss_chunks=16)


def graphs(name: str, folder: Path) -> list[tuple[str, Any, Case]]:
    """(row name, graph, case) for one case name (the U-Net gives two budgets)."""
    if name == "gpt3b":
        return [(name, gpt3b_graph(folder), Case(24 << 30, 150.0))]
    if name == "resnet200":
        return [(name, zoo_graph("resnet200", 64, "bf16", "adam"), Case(0.25, 60.0))]
    if name == "inception_v4":
        return [(name, zoo_graph("inception_v4", 64, "fp32", "sgd"), Case(0.33, 60.0))]
    if name == "resnet50":
        return [(name, zoo_graph("resnet50", 32, "fp32", "sgd"), Case("1:3", 60.0))]
    if name == "vgg19":
        return [(name, zoo_graph("vgg19", 64, "fp32", "sgd"), Case(0.86, 60.0))]
    if name == "unet":
        graph = unet_graph(folder)
        return [(f"unet@{b}", graph, Case(b, 30.0, layout=False)) for b in UNET_BUDGETS]
    if name in TRAINER_CUTS:
        layers, budget = TRAINER_CUTS[name]
        return [(name, trainer_graph(layers), Case(budget, 100.0))]
    raise SystemExit(f"unknown case {name!r}")


def shares(life: arena.Lifetimes) -> dict[str, Any]:
    """Each packing's extent as a share above the live peak, and its seconds."""
    live = life.live_peak()
    row: dict[str, Any] = {"buffers": len(life.spans), "live_bytes": live}
    for name, pack in (("greedy", packing.greedy_by_size), ("skyline", packing.skyline),
                       ("search", packing.tightest_packing)):
        started = time.perf_counter()
        extent = packing.extent(life, pack(life))
        row[name] = round((extent - live) / live, 6)
        row[f"{name}_s"] = round(time.perf_counter() - started, 2)
    return row


def plan(graph: Any, case: Case) -> dict[str, Any]:
    """Plan `graph` as optimize does on a GPU; each packing the fit loop asks for, compared."""
    costs = api.load_costs(graph, device="cuda", gpu="h200")
    if case.layout:
        graph, costs = api.default_layout(graph, costs, gpu="h200")
    ratio = case.budget if isinstance(case.budget, str) else None
    fast = None if ratio else (int(case.budget * graph.peak_live_bytes)
                               if isinstance(case.budget, float) else case.budget)
    config = PlanConfig(strategy="async", ratio=ratio, fast_mem_bytes=fast, device="cuda",
                        recompute="on", run=default_run_mode("cuda"), gpu="h200",
                        time_limit_s=case.time_limit_s)
    packs: list[dict[str, Any]] = []
    fit_pack = arena.pack

    def comparing(machine: Any, plan: Any, limit: int | None = None) -> Any:
        packs.append(shares(arena.lifetimes(machine, plan)) | {"limit_bytes": limit})
        return fit_pack(machine, plan, limit)

    arena.pack = comparing
    try:
        started = time.perf_counter()
        result = pipeline.optimize(graph, config, costs=costs, baselines=False)
        wall = time.perf_counter() - started
    finally:
        arena.pack = fit_pack
    header = result.plan.header if result.plan is not None else None
    return {"status": result.status, "wall_s": round(wall, 1), "packings": packs,
            "predicted_s": header.predicted_time_s if header else None,
            "arena_notes": [n for n in (header.notes if header else ()) if "arena" in n]}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--case", default="gpt3b,resnet200,inception_v4,resnet50,vgg19,unet")
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.case.split(","):
            for row_name, graph, case in graphs(name, Path(tmp)):
                row = {"case": row_name, **plan(graph, case)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    args.out.write_text(json.dumps({"cases": args.case, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
