"""The eager torch baselines: the same model trained by torch.autograd, as users run it today.

`measure_autograd` runs the training graph's forward kernels (and loss) on leaf weights with
autograd, `loss.backward()`, and a `torch.optim.SGD` (foreach) step, timing each iteration with
CUDA events. With ``save_on_cpu=True`` the forward runs inside
`torch.autograd.graph.save_on_cpu(pin_memory=True)`: every tensor saved for backward is copied
to pinned host memory and brought back when backward needs it (PyTorch's own activation
offloading). Neither run is capped: their measured peak is what they need.
"""

from __future__ import annotations

import contextlib
import statistics
from typing import TYPE_CHECKING

import torch

from autotm_py.errors import ConfigError
from autotm_py.kernels import run_kernel
from autotm_py.runtime.device import check_device, device_name, time_region
from autotm_py.runtime.executor import RunResult
from autotm_py.runtime.reference import init_values

if TYPE_CHECKING:
    from autotm_py.ir.graph import TensorGraph


def measure_autograd(graph: TensorGraph, *, device: str = "cuda", iterations: int = 5,
                     warmup: int = 2, save_on_cpu: bool = False, seed: int = 0) -> RunResult:
    """Time torch.autograd training iterations of a training graph's forward part."""
    meta = graph.meta.get("training")
    if meta is None:
        raise ConfigError(f"graph {graph.name!r} is not a training graph; derive it with "
                          "--training to compare against torch.autograd")
    dev = check_device(device)
    cuda = dev.startswith("cuda")
    values = init_values(graph, seed, dev)
    weights = dict(meta["weight_grads"])
    params = {w: values[w].clone().requires_grad_(True) for w in weights}
    opt = torch.optim.SGD(list(params.values()), lr=float(meta["learning_rate"]),
                          foreach=True)
    forward = graph.kernels[: meta["forward_kernels"]]
    loss_id = meta["loss"]
    times: list[float] = []
    peak = 0
    for i in range(warmup + iterations):
        seconds, iteration_peak = _iteration(forward, values, params, opt, loss_id, dev,
                                             save_on_cpu)
        if i >= warmup:
            times.append(seconds)
            peak = max(peak, iteration_peak or 0)
    return RunResult(
        device=dev, device_name=device_name(dev), iterations=iterations, warmup=warmup,
        iteration_times_s=tuple(times), median_s=statistics.median(times), kernel_times_s=None,
        peak_fast_bytes=peak if cuda else None, modelled_peak_fast_bytes=None,
        budget_bytes=None, cap_bytes=None, predicted_time_s=None, slow_pool_bytes=0,
        strategy="torch-save-on-cpu" if save_on_cpu else "torch-autograd",
        model_name=graph.name)


def _iteration(forward, values, params, opt, loss_id, dev, save_on_cpu):
    offload = torch.autograd.graph.save_on_cpu(pin_memory=dev.startswith("cuda")) \
        if save_on_cpu else contextlib.nullcontext()

    def step() -> None:
        env = {**values, **params}
        with offload:
            for k in forward:
                env.update(zip(k.outputs, run_kernel(k, [env[t] for t in k.inputs]),
                               strict=True))
        loss = env[loss_id]
        del env
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    sample = time_region(torch.device(dev), step)
    return sample.seconds, sample.peak
