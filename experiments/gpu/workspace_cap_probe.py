"""Does cuDNN's workspace cap (`CUDNN_CONV_WSCAP_DBG`, MiB) take effect under torch, and what
does it cost? For each convolution kernel (forward, data and filter gradient) of a zoo training
graph, in this process: its median time (CUDA events) and the bytes it allocates beside its
inputs and outputs (the workspace), measured as `autotm profile` measures them. Run it once
per cap, each in a process of its own (cuDNN and torch keep the algorithm they chose for a
shape for the life of the process); the cap is read from the environment and recorded.

Usage (GPU machine):
  CUDNN_CONV_WSCAP_DBG=64 python3 experiments/gpu/workspace_cap_probe.py OUT.json \
      inception_v4:64 resnet200:32 [--limit N]
Writes {"cap_mib": ..., "models": {model: [{name, op, signature, median_s, workspace}]}}.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

CONV_OPS = ("Conv", "ConvGrad", "ConvGradFilter")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("cells", nargs="+", help="MODEL:BATCH")
    parser.add_argument("--limit", type=int, default=0, help="at most N kernels per model")
    parser.add_argument("--free-mib", type=int, default=None,
                        help="run each kernel once first with only this much memory free "
                             "beside its inputs and outputs (torch then falls back to a "
                             "cuDNN engine whose workspace fits, and keeps it)")
    args = parser.parse_args()
    cap = os.environ.get("CUDNN_CONV_WSCAP_DBG")
    result = {"cap_mib": int(cap) if cap else None, "free_mib": args.free_mib, "models": {}}
    for cell in args.cells:
        model, batch = cell.split(":")
        started = time.perf_counter()
        result["models"][model] = probe(model, int(batch), args.limit, args.free_mib)
        print(f"{model} cap {cap}: {len(result['models'][model])} kernels "
              f"in {time.perf_counter() - started:.0f} s", flush=True)
    args.out.write_text(json.dumps(result, indent=1))


def probe(model: str, batch: int, limit: int, free_mib: int | None) -> list[dict]:
    import torch

    from autotm_py import api
    from autotm_py.profiling import torch_profiler
    from autotm_py.profiling.profile import unique_kernels

    graph = api.load_model(model, batch=batch, training=True)
    rows = []
    for kernel in unique_kernels(graph):
        if kernel.op_type not in CONV_OPS or (limit and len(rows) >= limit):
            continue
        args = torch_profiler.make_inputs(graph, kernel, "cuda")
        failed = choose_under(graph, kernel, args, free_mib) if free_mib is not None else None
        timing = torch_profiler.time_kernel(kernel, args, device="cuda")
        workspace = torch_profiler.measure_workspace(kernel, args, device="cuda")
        rows.append({"name": kernel.name, "op": kernel.op_type, "signature": kernel.signature,
                     "median_s": timing.median_s, "workspace": workspace,
                     "select_error": failed})
        del args
        torch.cuda.empty_cache()
    return rows


def choose_under(graph, kernel, args, free_mib: int) -> str | None:
    """Run the kernel once with the allocator capped at what is reserved now, plus its
    outputs (each rounded up to 2 MiB), plus `free_mib`."""
    import torch

    from autotm_py.profiling.torch_profiler import default_runner

    two = 2 << 20
    outputs = sum(-(-graph.tensors[t].nbytes // two) * two for t in kernel.outputs)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    allowed = torch.cuda.memory_reserved() + outputs + (free_mib << 20)
    torch.cuda.set_per_process_memory_fraction(min(allowed / total, 1.0))
    try:
        out = default_runner()(kernel, args)
        torch.cuda.synchronize()
        del out
        return None
    except Exception as exc:  # the smallest engine needs more: recorded
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
