"""One line per budget of experiments/gpu/chunks_bench.sh: the share of the unsplit peak, the
budget, the kernels the plan split (with their batch chunks), predicted and measured iteration,
their error, the reserved peak and the allocator's retries; with the unsplit graph's all-fast
iteration, torch.autograd of it and checkpointing from the same call's bench row.

    python experiments/gpu/chunks_summary.py OUT_DIR -o OUT_DIR/chunks.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from autotm_py.bench import read_result
from autotm_py.plan import Plan


def share_row(plan_file: Path, run_file: Path, peak: int | None) -> dict[str, Any]:
    """The line of one share: its plan's header and its run's measurements."""
    header = Plan.load(plan_file).header
    run = json.loads(run_file.read_text()) if run_file.exists() else {}
    predicted, measured = run.get("predicted_time_s"), run.get("median_s")
    budget = header.budget_bytes
    return {
        "ratio": plan_file.stem.removeprefix("plan_").replace("-", ":"),
        "budget_bytes": budget,
        "share_of_unsplit_peak": round(budget / peak, 3) if budget and peak else None,
        "split": list(header.model.split_conv_grads),
        "predicted_s": predicted, "measured_s": measured,
        "error": round((predicted - measured) / measured, 4) if predicted and measured else None,
        "reserved_peak_bytes": run.get("reserved_peak_bytes"),
        "alloc_retries": run.get("alloc_retries"), "replayed": run.get("replayed"),
    }


def summary(out: Path) -> dict[str, Any]:
    bench = out / "bench.json"
    row = read_result(bench)[0] if bench.exists() else {}
    peak = row.get("peak_bytes")
    return {
        "peak_bytes": peak,
        "measured_all_fast_s": row.get("measured_all_fast_s"),
        "measured_torch_autograd_s": row.get("measured_torch_autograd_s"),
        "measured_checkpoint_s": row.get("measured_checkpoint_s"),
        "shares": [share_row(p, out / p.name.replace("plan_", "run_"), peak)
                   for p in sorted(out.glob("plan_*.json"))],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="chunks_bench.sh's OUT_DIR")
    parser.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args(argv)
    doc = summary(args.out)
    args.output.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
