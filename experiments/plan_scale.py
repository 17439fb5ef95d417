"""How the planner scales to a model whose weights and optimizer state do not fit the budget
(issue 49 item 2): a GPT decoder of the zoo's form (`zoo.transformer.gpt_decoder`: pre-LN,
tied head, fused attention) at a given size, trained with Adam in bf16, planned under a cap
with each strategy; prints the graph's size, the build and solve seconds and the prediction.

    python3 experiments/plan_scale.py OUT.json [--layers 28 --d 3072 --heads 24 --seq 2048
        --batch 1 --budget 24GiB --strategies sync,async --time-limit 180 --gpu h200
        --optimizer-on gpu|host]

The defaults are issue 49's model: 3.33B parameters, sequence 2048, under a 24 GiB cap, priced
with the H200's profiles (roofline estimates for its kernels: none is profiled yet). The model
has no weights (shapes are enough to plan). Each strategy is one `autotm optimize` in a child
process, timed on the wall clock, as a user would run it.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autotm_py.frontend.zoo.transformer import gpt_decoder  # noqa: E402


def export(args: argparse.Namespace, folder: Path) -> Path:
    cfg = {"layers": args.layers, "d": args.d, "heads": args.heads, "vocab": args.vocab,
           "positions": args.seq}
    b = gpt_decoder(cfg, name=f"gpt_{args.layers}x{args.d}")
    model = b.build({"batch": args.batch, "seq": args.seq}, "GPT decoder (plan_scale.py)",
                    {"input_ids": args.vocab})
    params = sum(math.prod(i.dims) for i in model.graph.initializer)
    path = folder / f"gpt_{args.layers}x{args.d}.onnx"
    onnx.save(model, path)
    print(f"{path.name}: {params / 1e9:.2f}B parameters", flush=True)
    return path


# `--no-overlap-start`: the async search starts from the sync plan as it is (the A/B of
# solve._overlap_start, docs/planning.md "Overlapped start")
NO_OVERLAP = ("import sys, autotm_py.planning.solve as s; s._overlap_start = lambda f, b: None; "
              "from autotm_py.cli import main; sys.exit(main(sys.argv[1:]))")


def plan(path: Path, strategy: str, args: argparse.Namespace, folder: Path) -> dict:
    run = [sys.executable, "-c", NO_OVERLAP] if args.no_overlap_start else \
        [sys.executable, "-m", "autotm_py"]
    cmd = [*run, "optimize", str(path), "--training",
           "--precision", "bf16", "--optimizer", "adam", "--gpu", args.gpu,
           "--optimizer-on", args.optimizer_on,
           "--fast-mem", args.budget, "--strategy", strategy, "--time-limit",
           str(args.time_limit), "--no-baselines", "--json", "-o",
           str(folder / f"plan_{strategy}.json")]
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT)
    row = {"strategy": strategy, "optimizer_on": args.optimizer_on,
           "overlap_start": not args.no_overlap_start,
           "wall_s": time.perf_counter() - started}
    if done.returncode != 0:
        return row | {"error": done.stderr.strip()[-500:]}
    data = json.loads(done.stdout)
    solver = data.get("solver", {})
    return row | {"predicted_s": data.get("predicted_time_s"),
                  "all_fast_s": data.get("all_fast_time_s"), "solver": solver,
                  "host_updates": [n for n in data.get("notes", ()) if "on the host" in n]}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--layers", type=int, default=28)
    p.add_argument("--d", type=int, default=3072)
    p.add_argument("--heads", type=int, default=24)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--budget", default="24GiB")
    p.add_argument("--strategies", default="sync,async")
    p.add_argument("--time-limit", type=float, default=180.0)
    p.add_argument("--gpu", default="h200")
    p.add_argument("--optimizer-on", choices=("gpu", "host"), default="gpu",
                   help="where the Adam updates run (`optimize --optimizer-on`)")
    p.add_argument("--no-overlap-start", action="store_true",
                   help="the async search starts from the sync plan's blocking copies")
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = export(args, Path(tmp))
        for strategy in args.strategies.split(","):
            rows.append(plan(path, strategy, args, Path(tmp)))
            print(json.dumps(rows[-1]), flush=True)
    args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                    "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
