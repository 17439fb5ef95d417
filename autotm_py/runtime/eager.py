"""The eager torch baselines: the same model trained by torch.autograd, as users run it today.

`measure_autograd` runs the training graph's forward kernels (and loss) on leaf weights with
autograd, `loss.backward()`, and a `torch.optim.SGD` (foreach) step, timing each iteration with
CUDA events. Variants, as a PyTorch user would write them:

- ``save_on_cpu=True``: the forward runs inside
  `torch.autograd.graph.save_on_cpu(pin_memory=True)`: every tensor saved for backward is
  copied to pinned host memory and brought back when backward needs it (PyTorch's activation
  offloading);
- ``segments=n``: activation checkpointing. The forward kernels are cut into n segments at
  low-crossing points (`runtime.segments`), and every segment but the last runs under
  `torch.utils.checkpoint.checkpoint(use_reentrant=False)`, as `checkpoint_sequential` does:
  only the tensors crossing a boundary are kept, each segment's activations are recomputed in
  backward;
- ``cap_budget_bytes``: the run is capped like a plan's (budget + slack, the executor's cap).

`fit_checkpointing` searches the smallest segment count whose run fits a budget under the cap
(the checkpointing baseline of `autotm bench --execute`).
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import torch
from torch.utils.checkpoint import checkpoint

from autotm_py.errors import ConfigError, ExecutionError
from autotm_py.kernels import run_kernel
from autotm_py.runtime.device import (
    apply_cap,
    check_device,
    configure_cuda,
    device_name,
    release_cap,
    time_region,
)
from autotm_py.runtime.execute import RunResult
from autotm_py.runtime.reference import init_values
from autotm_py.runtime.segments import Segment, forward_segments

if TYPE_CHECKING:
    from autotm_py.ir.graph import TensorGraph

# Segment counts `fit_checkpointing` tries, smallest first (1: no checkpointing).
SEGMENT_COUNTS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


def measure_autograd(graph: TensorGraph, *, device: str = "cuda", iterations: int = 5,
                     warmup: int = 2, save_on_cpu: bool = False, segments: int | None = None,
                     cap_budget_bytes: int | None = None, cap_slack_bytes: int = 64 << 20,
                     seed: int = 0) -> RunResult:
    """Time torch.autograd training iterations of a training graph's forward part (see the
    module docstring for the variants). A capped run that runs out of memory raises
    `ExecutionError`."""
    meta = _training_meta(graph)
    dev = check_device(device)
    cuda = dev.startswith("cuda")
    step, parts = _autograd_step(graph, meta, dev, seed, save_on_cpu, segments)
    cap = apply_cap(cap_budget_bytes, dev, cap_budget_bytes is not None, cap_slack_bytes)
    times: list[float] = []
    host_times: list[float] = []
    peak = 0
    try:
        for i in range(warmup + iterations):
            sample = time_region(torch.device(dev), step)
            if i >= warmup:
                times.append(sample.seconds)
                host_times.append(sample.host_seconds)
                peak = max(peak, sample.peak or 0)
    except torch.OutOfMemoryError as exc:
        raise ExecutionError(f"torch autograd with {len(parts)} checkpointed segments ran out "
                             f"of memory under the cap of {cap} bytes") from exc
    finally:
        if cap is not None:
            release_cap(dev)
    return RunResult(
        device=dev, device_name=device_name(dev), iterations=iterations, warmup=warmup,
        iteration_times_s=tuple(times), median_s=statistics.median(times), kernel_times_s=None,
        peak_fast_bytes=peak if cuda else None, modelled_peak_fast_bytes=None,
        budget_bytes=cap_budget_bytes, cap_bytes=cap, predicted_time_s=None, slow_pool_bytes=0,
        strategy=_strategy(save_on_cpu, len(parts) if segments else None),
        model_name=graph.name, host_median_s=statistics.median(host_times))


def _strategy(save_on_cpu: bool, segments: int | None) -> str:
    if save_on_cpu:
        return "torch-save-on-cpu"
    return f"torch-checkpoint-{segments}" if segments else "torch-autograd"


def fit_checkpointing(graph: TensorGraph, budget_bytes: int, *, device: str = "cuda",
                      iterations: int = 5, warmup: int = 2,
                      counts: Sequence[int] = SEGMENT_COUNTS) -> RunResult | None:
    """The run with the fewest checkpointed segments that fits `budget_bytes` under the cap
    (None when even the most segments do not fit); its notes say which counts ran out."""
    missed: list[str] = []
    for n in counts:
        if n > graph.meta["training"]["forward_kernels"]:
            break
        try:
            run = measure_autograd(graph, device=device, iterations=iterations, warmup=warmup,
                                   segments=n, cap_budget_bytes=budget_bytes)
        except ExecutionError:
            missed.append(str(n))
            continue
        note = f"{n} checkpointed segments" + (f" (out of memory with {', '.join(missed)})"
                                               if missed else "")
        return replace(run, notes=(*run.notes, note))
    return None


def _run_segment(graph: TensorGraph, segment: Segment, *tensors: torch.Tensor
                 ) -> tuple[torch.Tensor, ...]:
    env = dict(zip(segment.inputs, tensors, strict=True))
    for k in graph.kernels[segment.start:segment.stop]:
        env.update(zip(k.outputs, run_kernel(k, [env[t] for t in k.inputs]), strict=True))
    return tuple(env[t] for t in segment.outputs)


def _forward(graph: TensorGraph, parts: list[Segment], env: dict[int, torch.Tensor]) -> None:
    """Run the forward segments; all but the last under checkpoint when there are several."""
    for i, seg in enumerate(parts):
        args = [env[t] for t in seg.inputs]
        if len(parts) > 1 and i < len(parts) - 1:
            outs = checkpoint(_run_segment, graph, seg, *args, use_reentrant=False)
        else:
            outs = _run_segment(graph, seg, *args)
        env.update(zip(seg.outputs, outs, strict=True))


def autograd_step(graph: TensorGraph, *, device: str = "cuda", seed: int = 0,
                  save_on_cpu: bool = False, segments: int | None = None
                  ) -> Callable[[], torch.Tensor]:
    """One torch.autograd training iteration of `measure_autograd` as a function (on seeded
    values, made once): it runs the step and returns the loss. For profilers
    (experiments/gpu/transformer_compare.py compares its kernels with ours)."""
    meta = _training_meta(graph)
    return _autograd_step(graph, meta, check_device(device), seed, save_on_cpu, segments)[0]


def _training_meta(graph: TensorGraph) -> dict:
    meta = graph.meta.get("training")
    if meta is None:
        raise ConfigError(f"graph {graph.name!r} is not a training graph; derive it with "
                          "--training to compare against torch.autograd")
    return meta


def _autograd_step(graph: TensorGraph, meta: dict, dev: str, seed: int, save_on_cpu: bool,
                   segments: int | None) -> tuple[Callable[[], torch.Tensor], list[Segment]]:
    """The iteration function and the forward's segments."""
    if dev.startswith("cuda"):
        configure_cuda(deterministic=False)
    values = init_values(graph, seed, dev)
    params = {w: values[w].clone().requires_grad_(True) for w, _ in meta["weight_grads"]}
    opt = torch.optim.SGD(list(params.values()), lr=float(meta["learning_rate"]),
                          foreach=True)
    n_forward, loss_id = meta["forward_kernels"], meta["loss"]
    parts = forward_segments(graph, n_forward, segments or 1, keep=(loss_id,))
    offload = torch.autograd.graph.save_on_cpu(pin_memory=dev.startswith("cuda")) \
        if save_on_cpu else contextlib.nullcontext()

    def step() -> torch.Tensor:
        env = {**values, **params}
        with offload:
            _forward(graph, parts, env)
        loss = env[loss_id]
        del env
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.detach()

    return step, parts
