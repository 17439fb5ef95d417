"""One compact line per row of the corpus benchmark (experiments/gpu/corpus_bench.sh).

Reads the rows of an `autotm bench` result (its CSV or JSON) and writes OUT.csv and OUT.json
with, per plan: the model (file stem), batch, ratio, strategy, budget and peak, the solver
status, predicted and measured iteration, their error, and what the same run measured beside
it (our all-fast, torch.autograd, PyTorch checkpointing under the cap, the best baseline under
the cap), plus the median and largest prediction error over the measured rows.

    python experiments/gpu/corpus_summary.py OUT/corpus_bench.json -o OUT/corpus_summary.csv
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
from pathlib import Path
from typing import Any

from autotm_py.bench import read_result

COLUMNS = ("model", "batch", "ratio", "strategy", "budget_bytes", "peak_bytes", "status",
           "predicted_s", "measured_s", "error", "measured_all_fast_s",
           "measured_torch_autograd_s", "measured_checkpoint_s", "best_baseline",
           "best_baseline_s", "measured_peak_fast_bytes")
BASELINES = ("first_touch", "lru", "offload")


def _best_baseline(row: dict[str, Any]) -> tuple[str | None, float | None]:
    """The fastest baseline the run measured under the cap (None where none ran)."""
    times = {b: row.get(f"measured_{b}_s") for b in BASELINES}
    measured = {b: t for b, t in times.items() if t}
    if not measured:
        return None, None
    best = min(measured, key=measured.__getitem__)
    return best, measured[best]


def summary_row(row: dict[str, Any]) -> dict[str, Any]:
    predicted, measured = row.get("predicted_s"), row.get("measured_s")
    best, best_s = _best_baseline(row)
    out = {c: row.get(c) for c in COLUMNS}
    out.update(model=Path(str(row["model"])).stem, best_baseline=best, best_baseline_s=best_s,
               error=(predicted - measured) / measured if predicted and measured else None)
    return out


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    lines = [summary_row(r) for r in rows]
    errors = [abs(r["error"]) for r in lines if r["error"] is not None]
    return {"rows": lines, "measured": len(errors),
            "median_abs_error": statistics.median(errors) if errors else None,
            "max_abs_error": max(errors) if errors else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("result", type=Path, help="the bench's CSV or JSON")
    parser.add_argument("-o", "--out", type=Path, required=True,
                        help="OUT.csv (OUT.json is written beside it)")
    args = parser.parse_args(argv)
    doc = summarize(read_result(args.result))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(doc["rows"])
    args.out.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    median = doc["median_abs_error"]
    print(f"{len(doc['rows'])} rows, {doc['measured']} measured"
          + (f", median |error| {median:.1%}" if median is not None else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
