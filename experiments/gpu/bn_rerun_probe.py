"""What a batch norm's re-run from its saved statistics costs against its first run.

A plan re-runs a training-mode batch norm as `BatchNormApply` (`autotm_py/ir/rerun.py`): on
CUDA, where torch runs its native kernel (bf16, channels-last), that is the first run's last
step alone (`batch_norm_elemt`). The planner prices it at `ir.rerun.APPLY_SHARE` (2/3) of the
batch norm's profiled time, from the bytes: X read once and Y written, against X read twice
and Y written. For each distinct batch norm of a zoo model's training graph this times, with
the executor's own kernels (`run_kernel`, CUDA events, medians of `--iterations` after 5
warm-ups):

- `first`: the batch norm's first run (statistics, running statistics, Y);
- `again`: its re-run from the saved statistics;
- `relu`: a ReLU over the same Y, an elementwise pass for scale;

and, weighted by how many batch norms of the graph have each shape, the share `again / first`
that `APPLY_SHARE` stands for.

    python3 experiments/gpu/bn_rerun_probe.py OUT.json [--model resnet200] [--batch 64]
        [--precision bf16] [--no-channels-last] [--device cuda|cpu] [--iterations 30]

`--device cpu` runs the same on the CPU (where the re-run is the first run's kernel again
without the running statistics): a smoke test of the script, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from autotm_py import api
from autotm_py.fileio import atomic_write_text
from autotm_py.ir.rerun import APPLY_SHARE, rerun_kernel
from autotm_py.kernels import run_kernel
from autotm_py.kernels.util import empty_like_tensor

WARMUP = 5


def median_ms(fn, device: str, iterations: int) -> float:
    for _ in range(WARMUP):
        fn()
    samples = []
    for _ in range(iterations):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def _value(graph, tid: int, device: str) -> torch.Tensor:
    value = empty_like_tensor(graph.tensors[tid], device)
    if value.is_floating_point():
        value.normal_()
    return value


def shape_row(graph, kernel, device: str, iterations: int) -> dict:
    """The three timings of one batch norm (module docstring)."""
    args = [_value(graph, t, device) for t in kernel.inputs]
    args[4].abs_().add_(0.5)  # a running variance
    y, _, _, saved_mean, saved_invstd = run_kernel(kernel, args)
    again = rerun_kernel(kernel)
    again_args = [args[0], args[1], args[2], saved_mean, saved_invstd]
    (regenerated,) = run_kernel(again, again_args)
    if not torch.equal(regenerated, y):
        raise SystemExit(f"{kernel.name}: the re-run's Y differs from the first run's")
    x = graph.tensors[kernel.inputs[0]]
    return {
        "shape": list(x.shape), "dtype": x.dtype, "channels_last": 0 in kernel.channels_last,
        "first_ms": median_ms(lambda: run_kernel(kernel, args), device, iterations),
        "again_ms": median_ms(lambda: run_kernel(again, again_args), device, iterations),
        "relu_ms": median_ms(lambda: torch.relu(y), device, iterations),
    }


def summary(rows: list[dict]) -> dict:
    """Totals over the graph's batch norms (each row times its count) and the share."""
    total = {key: sum(r[key] * r["count"] for r in rows) for key in
             ("first_ms", "again_ms", "relu_ms")}
    return {**total, "share": total["again_ms"] / total["first_ms"] if total["first_ms"] else
            None, "apply_share_priced": APPLY_SHARE, "batch_norms": sum(r["count"] for r in rows)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--model", default="resnet200")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--precision", default="bf16", choices=("bf16", "fp32"))
    ap.add_argument("--no-channels-last", dest="channels_last", action="store_false")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--iterations", type=int, default=30)
    a = ap.parse_args()
    graph = api.load_model(a.model, batch=a.batch, training=True, precision=a.precision,
                           channels_last=a.channels_last)
    batch_norms = [k for k in graph.kernels if rerun_kernel(k) is not k]
    counts = Counter(k.signature for k in batch_norms)
    rows = []
    for signature, count in counts.items():
        kernel = next(k for k in batch_norms if k.signature == signature)
        rows.append({**shape_row(graph, kernel, a.device, a.iterations), "count": count})
        print(json.dumps(rows[-1]), flush=True)
    result = {"model": a.model, "batch": a.batch, "precision": a.precision,
              "channels_last": a.channels_last, "device": a.device,
              "gpu": torch.cuda.get_device_name() if a.device == "cuda" else None,
              "torch": torch.__version__, "rows": rows, "summary": summary(rows)}
    atomic_write_text(a.out, json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["summary"]))


if __name__ == "__main__":
    main()
