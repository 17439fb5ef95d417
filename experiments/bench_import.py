"""Issue 2, item 8: seconds to import + derive training for the largest zoo training graphs.

Runs each case several times in fresh processes' worth of work (a new import each time) and
reports the median, so the shared machine's noise shows up as spread, not as the number.

    python experiments/bench_import.py [--repeats 5] [-o experiments/results/import_speed.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

from autotm_py.frontend.onnx import import_onnx
from autotm_py.ir.training import derive_training

ROOT = Path(__file__).resolve().parents[1]
CASES = [("densenet264", {"batch": 512}), ("gpt2_small", {})]


def time_case(name: str, dims: dict[str, int]) -> dict[str, float | int]:
    start = time.perf_counter()
    graph = import_onnx(ROOT / "models" / f"{name}.onnx", batch=dims.get("batch"))
    imported = time.perf_counter()
    train = derive_training(graph)
    derived = time.perf_counter()
    return {"import_s": imported - start, "derive_s": derived - imported,
            "total_s": derived - start, "forward_kernels": len(graph.kernels),
            "training_kernels": len(train.kernels), "tensors": len(train.tensors)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("-o", "--output", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    for name, dims in CASES:
        runs = [time_case(name, dims) for _ in range(args.repeats)]
        row = {"model": name, **dims, "repeats": args.repeats,
               **{k: runs[0][k] for k in ("forward_kernels", "training_kernels", "tensors")}}
        for key in ("import_s", "derive_s", "total_s"):
            values = [r[key] for r in runs]
            row[f"{key}_median"] = statistics.median(values)
            row[f"{key}_min"], row[f"{key}_max"] = min(values), max(values)
        rows.append(row)
        print(f"{name:12s} import {row['import_s_median']:.3f} s + derive "
              f"{row['derive_s_median']:.3f} s = {row['total_s_median']:.3f} s (median of "
              f"{args.repeats}; {row['forward_kernels']} -> {row['training_kernels']} kernels)")
    if args.output:
        from autotm_py.fileio import atomic_write_text

        doc = {"machine": f"{platform.processor() or platform.machine()}, "
                          f"{__import__('os').cpu_count()} cores", "rows": rows,
               "date": time.strftime("%Y-%m-%d", time.gmtime())}
        atomic_write_text(args.output, json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
