"""How a plan's `Recompute` re-runs a forward kernel (docs/planning.md section 2b).

Most kernels are re-run as they first ran: the same inputs, every output (the outputs a record
does not keep are the re-run's scratch). A training-mode batch norm is not: its first run
computed the batch statistics, updated the running ones and saved the mean and 1/std for its
backward, and Y is those statistics applied to X. Its re-run applies the saved statistics:

    BatchNormApply(X, scale, B, saved mean, saved invstd) -> Y

It reads neither running statistic (so a re-run late in the backward pass holds no old copy of
them) and regenerates only Y: the saved statistics are not recomputed, they stay wherever the
plan keeps them for the batch norm's gradient (a few KiB each). Y is the first run's bit for
bit: on CUDA where torch runs its native batch norm, that kernel's last step is this very
elementwise kernel on the same saved statistics (`torch.batch_norm_elemt`); elsewhere (the CPU,
cuDNN's batch norm) the re-run is the first run's own call again on throwaway running
statistics, which Y does not depend on (`kernels.batch_norm.batch_norm_apply`).

`rerun_share` prices it where it runs as the elementwise kernel at `APPLY_SHARE` of the batch
norm's profiled time: measured, not the bytes' 2/3 (X read once and Y written, against X read
twice and Y written), since the statistics' reduction runs far from the memory's speed.
"""

from __future__ import annotations

from dataclasses import replace

from autotm_py.ir.graph import Kernel, TensorGraph
from autotm_py.ir.rules.base import BACKWARD_DOMAIN

BN_APPLY = "BatchNormApply"
# the share of a training-mode batch norm's time its re-run from saved statistics takes where
# it runs as one elementwise pass: 0.328 over ResNet-200 b64's 203 bf16 channels-last batch
# norms on an H100 (6.35 of 19.35 ms with the executor's kernels, 2026-12-07;
# experiments/gpu/bn_rerun_probe.py, experiments/results/bn_rerun/)
APPLY_SHARE = 1.0 / 3.0
# cuDNN's smallest epsilon (CUDNN_BN_MIN_EPSILON): torch runs its native kernel below it
CUDNN_MIN_EPSILON = 1e-5


def from_saved_statistics(kernel: Kernel) -> bool:
    """A training-mode batch norm with its five outputs (Y, running mean', var', saved mean,
    saved invstd): re-run from its saved statistics."""
    return kernel.op_type == "BatchNormalization" and kernel.domain == "" and \
        bool(kernel.attr("training_mode", 0)) and len(kernel.outputs) == 5


def rerun_kernel(kernel: Kernel) -> Kernel:
    """The kernel a re-run of `kernel` runs: `kernel` itself, or for a training-mode batch norm
    `BatchNormApply` (module docstring), under the same id and name."""
    if not from_saved_statistics(kernel):
        return kernel
    x, scale, bias = kernel.inputs[:3]
    return replace(kernel, op_type=BN_APPLY, domain=BACKWARD_DOMAIN,
                   inputs=(x, scale, bias, kernel.outputs[3], kernel.outputs[4]),
                   outputs=kernel.outputs[:1], signature=f"{kernel.signature}|apply",
                   workspace_bytes=0, channels_last=tuple(p for p in kernel.channels_last
                                                          if p == 0))


def rerun_share(graph: TensorGraph, kernel: Kernel, *, gpu: bool) -> float:
    """The share of `kernel`'s time a re-run takes: `APPLY_SHARE` for a batch norm re-run on a
    GPU where torch runs its native kernel (bf16, channels-last, which cuDNN would want a
    reserve for, rank 2 or an epsilon below cuDNN's), else 1 (the kernel runs again whole)."""
    if not gpu or not from_saved_statistics(kernel):
        return 1.0
    x = graph.tensors[kernel.inputs[0]]
    native = x.dtype == "bfloat16" or 0 in kernel.channels_last or len(x.shape) < 3 or \
        float(kernel.attr("epsilon", 1e-5)) < CUDNN_MIN_EPSILON
    return APPLY_SHARE if native else 1.0
