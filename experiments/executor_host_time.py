"""The executor's own host time per plan record, with every kernel stubbed out (CPU).

    python experiments/executor_host_time.py densenet264 [--batch 1] [--repeats 15]

Each kernel returns cached one-element tensors instead of computing, so what is timed is the
interpreter of plan records and the executor's bookkeeping (reads, stores, frees, the reuse
checks): the floor of an eager iteration's host time, which a CUDA-graph replay does not pay.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Iterator

import torch

from autotm_py import api, pipeline

try:  # where the executor's memory strategies run kernels (`runtime.memory`)
    from autotm_py.runtime import memory as memory_module
    from autotm_py.runtime.execute import new_executor
except ImportError:  # an older checkout on PYTHONPATH (gpu/host_overhead.py runs any)
    from autotm_py.runtime import executor as memory_module
    from autotm_py.runtime.executor import new_executor


@contextlib.contextmanager
def stubbed_kernels(device: str = "cpu") -> Iterator[None]:
    """Within it, every kernel (and the optimizer step's foreach update) returns cached
    one-element tensors on `device` instead of computing: what the executor then spends is its
    own host time. The GPU probe `gpu/host_overhead.py` uses it too."""
    cache: dict[str, list[torch.Tensor]] = {}

    def stub(kernel, args):
        if kernel.name not in cache:
            cache[kernel.name] = [torch.empty(1, device=device) for _ in kernel.outputs]
        return list(cache[kernel.name])

    saved = (memory_module.run_kernel, memory_module.run_kernel_raw,
             memory_module.run_kernel_into, torch._foreach_add_)
    memory_module.run_kernel = stub
    memory_module.run_kernel_raw = stub
    memory_module.run_kernel_into = lambda kernel, args, outs: False
    torch._foreach_add_ = lambda *args, **kwargs: None
    try:
        yield
    finally:
        (memory_module.run_kernel, memory_module.run_kernel_raw,
         memory_module.run_kernel_into, torch._foreach_add_) = saved


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    graph = api.load_model(args.model, batch=args.batch, training=True)
    plan = pipeline.all_fast_plan(graph)
    times = []
    with stubbed_kernels():
        executor = new_executor(graph, plan, "cpu", 1, True)[1]
        for i in range(args.repeats + 3):
            executor.prepare()
            start = time.perf_counter()
            executor.run()
            if i >= 3:
                times.append(time.perf_counter() - start)
    median = statistics.median(times)
    print(f"{args.model}: {len(plan.records)} records, {len(graph.kernels)} kernels: "
          f"{median * 1e3:.1f} ms per iteration, {median / len(plan.records) * 1e6:.2f} us per "
          f"record (median of {args.repeats})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
