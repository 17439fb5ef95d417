"""Why in-context kernel times of a small graph do not sum to its iteration (a probe).

Runs the test suite's small CNN training graph through the executor plainly and with per-kernel
events, and prints both medians, the sum of the corrected per-kernel samples, the largest
per-kernel intervals, and the same with cuDNN disabled. Usage (GPU machine):
    python3 experiments/gpu/in_context_probe.py
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from autotm_py.ir.training import derive_training  # noqa: E402
from autotm_py.options import Measure  # noqa: E402
from autotm_py.pipeline import all_fast_plan  # noqa: E402
from autotm_py.profiling.in_context import remove_event_overhead  # noqa: E402
from autotm_py.runtime.execute import execute  # noqa: E402
from tests.test_training_models import small_cnn  # noqa: E402


def probe(label: str) -> None:
    graph = derive_training(small_cnn(), optimizer="sgd")
    plan = all_fast_plan(graph)
    plain = execute(graph, plan, device="cuda",
                    measure=Measure(iterations=7, warmup=2, capped=False))
    run = execute(graph, plan, device="cuda",
                  measure=Measure(iterations=7, warmup=2, kernel_times=True, capped=False,
                                  per_iteration_kernel_times=True))
    samples = run.kernel_samples_s or ()
    corrected, overhead = remove_event_overhead(samples, plain.median_s)
    sums = [sum(s) for s in samples]
    print(f"{label}: plain {[round(t * 1e3, 3) for t in plain.iteration_times_s]} ms; "
          f"instrumented median {run.median_s * 1e3:.3f} ms; raw interval sums "
          f"{[round(s * 1e3, 3) for s in sums]} ms; corrected sum median "
          f"{statistics.median(sum(c) for c in corrected) * 1e3:.3f} ms; overhead/event "
          f"{overhead * 1e6:.1f} us; host {(plain.host_median_s or 0) * 1e3:.3f} ms")
    last = samples[-1] if samples else []
    top = sorted(range(len(last)), key=lambda i: -last[i])[:6]
    print("   largest intervals:", [(graph.kernels[i].op_type, round(last[i] * 1e3, 3))
                                     for i in top])


if __name__ == "__main__":
    probe("cudnn on")
    torch.backends.cudnn.enabled = False
    probe("cudnn off")
