"""Outputs written over inputs that die at their kernel (`autotm_py/runtime/reuse.py`), on and
off, side by side in one process: each model's all-fast plan run eagerly on torch's caching
allocator and replayed as a CUDA graph with static inputs, alternating the two settings for
`--rounds` rounds, beside native eager PyTorch measured in the same process (`native_compare`).

    python3 experiments/gpu/reuse_check.py $OUT/reuse.json --models densenet264,resnet200

Per run: median iteration time, host time, allocated and reserved peaks (a replay allocates
nothing: its memory is what the allocator holds). Medians over the rounds go in the summary.
`--profile`: also one eager iteration of each setting under the torch profiler, whose table of
host (self CPU) time per op goes to OUT with the suffix .profile.txt: where a host-bound eager
run's time goes, to tell the setting's cost from the host's noise.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from native_compare import SHAPES, measure_native

from autotm_py import api, pipeline
from autotm_py.options import RunMode
from autotm_py.runtime import memory as memory_module
from autotm_py.runtime.device import configure_cuda
from autotm_py.runtime.reuse import overwritable_inputs

DEV = "cuda:0"


def set_reuse(reuse: bool) -> None:
    """For the executors made from now on (each looks the choice up when it is made): off, no
    input is written over."""
    memory_module.overwritable_inputs = overwritable_inputs if reuse else (lambda g, p: {})
    torch.cuda.empty_cache()


def run_ours(graph, plan, reuse: bool, replay: bool, iterations: int) -> dict:
    set_reuse(reuse)
    run = api.execute(graph, plan, device=DEV, iterations=iterations, warmup=2,
                      mode=RunMode(replay=replay), capped=False)
    return {"reuse": reuse, "graph": run.replayed, "median_s": run.median_s,
            "host_s": run.host_median_s, "peak_bytes": run.peak_fast_bytes,
            "reserved_peak_bytes": run.reserved_peak_bytes, "notes": list(run.notes)}


def profile_table(graph, plan, reuse: bool) -> str:
    """Self CPU time per op over one eager iteration (after three warm-ups)."""
    from torch.profiler import ProfilerActivity, profile

    from autotm_py.runtime.execute import new_executor

    set_reuse(reuse)
    _, executor, _ = new_executor(graph, plan, DEV, 1, False)

    def iteration() -> None:
        executor.prepare()
        executor.run()
        torch.cuda.synchronize()

    for _ in range(3):
        iteration()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        iteration()
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18)
    return f"reuse={reuse}, {executor.state.overwritten} outputs written over inputs\n{table}"


def summary(runs: list[dict]) -> dict:
    out = {}
    for replay in (False, True):
        for reuse in (True, False):
            sel = [r for r in runs if r["graph"] == replay and r["reuse"] == reuse]
            if sel:
                out[f"{'replay' if replay else 'eager'}_{'reuse' if reuse else 'no_reuse'}"] = {
                    k: statistics.median(r[k] for r in sel)
                    for k in ("median_s", "host_s", "peak_bytes", "reserved_peak_bytes")
                    if all(r[k] is not None for r in sel)}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--models", default="densenet264,resnet200,bert_base,gpt2_small")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    configure_cuda(deterministic=False)
    rows = []
    for name in args.models.split(","):
        batch, dims = SHAPES[name]
        graph = api.load_model(name, batch=batch, dims=dims, training=True)
        plan = pipeline.all_fast_plan(graph)
        chosen = overwritable_inputs(graph, plan)
        native = [measure_native(name, batch, dims, args.iterations)]
        runs = []
        for round_ in range(args.rounds):
            # alternate which setting runs first: the run after native's may pay for it
            for reuse in (True, False) if round_ % 2 == 0 else (False, True):
                for replay in (False, True):
                    runs.append(run_ours(graph, plan, reuse, replay, args.iterations))
            native.append(measure_native(name, batch, dims, args.iterations))
        row = {"model": name, "batch": batch, "dims": dims,
               "device": torch.cuda.get_device_name(0), "overwritable": len(chosen),
               "native_eager": native, "runs": runs, "summary": summary(runs)}
        rows.append(row)
        if args.profile:
            tables = [f"== {name}\n{profile_table(graph, plan, reuse)}" for reuse in (True, False)]
            with args.out.with_suffix(".profile.txt").open("a") as f:
                f.write("\n".join(tables) + "\n")
        print(json.dumps({"model": name, "summary": row["summary"],
                          "native_median_s": [n.get("median_s") for n in native],
                          "native_reserved": [n.get("reserved_peak_bytes") for n in native]}),
              flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(rows, indent=1))
        tmp.replace(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
