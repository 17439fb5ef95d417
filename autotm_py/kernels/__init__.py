"""Torch implementations of every IR op: forward (ONNX), loss, backward and optimizer ops.

`run_kernel(kernel, args)` runs one kernel on torch tensors (any device) and returns its
outputs in `kernel.outputs` order. The profiler, the reference runner and the plan executor
all call it. Implementations live in `nn`, `tensor`, `resize` (forward), `recurrent` (LSTM,
GRU and their gradients), `grad_nn`, `grad_tensor` (backward, loss gradient, optimizers);
`util` holds the registry. This package sits below profiling and runtime, which both run
kernels.

Contract for callers:
- arguments are never modified; outputs may be views of arguments (shape ops, Identity,
  ConcatGrad), as in torch itself, so treat every tensor as immutable;
- forward kernels are differentiable by torch.autograd (the training tests use that);
- on CUDA, GatherGrad, PadGrad (reflect/edge) and ResizeGrad use index_add_, which is
  deterministic only under `torch.use_deterministic_algorithms(True)`; cuDNN convolution
  backward likewise needs `torch.backends.cudnn.deterministic = True` for bitwise repeats.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from autotm_py.errors import ExecutionError, UnsupportedOpError
from autotm_py.ir.graph import Kernel
from autotm_py.kernels import (  # noqa: F401  (importing registers the kernels)
    decoder,
    fused,
    grad_nn,
    grad_tensor,
    nn,
    recurrent,
    resize,
    tensor,
)
from autotm_py.kernels.into import INTO, run_kernel_into
from autotm_py.kernels.util import REGISTRY, TORCH_DTYPES, Impl, torch_dtype

KERNELS: dict[str, Impl] = REGISTRY
SUPPORTED_KERNELS: frozenset[str] = frozenset(REGISTRY)

__all__ = ["INTO", "KERNELS", "SUPPORTED_KERNELS", "TORCH_DTYPES", "run_kernel",
           "run_kernel_into", "run_kernel_raw", "torch_dtype"]


def run_kernel(kernel: Kernel, args: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Run one kernel; `args` in `kernel.inputs` order, outputs in `kernel.outputs` order."""
    # Outputs are materialized in the graph's layout (row-major, or channels-last for the
    # images of `ir.layout`): a strided view (a transpose, a split slice) would make its
    # readers' numerics depend on whether a plan copied it (a copy is dense), and the IR
    # accounts every output as its own bytes anyway.
    outs = run_kernel_raw(kernel, args)
    if not kernel.channels_last:
        return [o.contiguous() for o in outs]
    return [o.contiguous(memory_format=torch.channels_last if i in kernel.channels_last
                         else torch.contiguous_format) for i, o in enumerate(outs)]


def run_kernel_raw(kernel: Kernel, args: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """`run_kernel` without making outputs contiguous: an output may be a strided view of an
    argument (the arena executor copies it into its slot, which makes it contiguous)."""
    try:
        impl = KERNELS[kernel.op_type]
    except KeyError:
        raise UnsupportedOpError(kernel.op_type, domain=kernel.domain, node=kernel.name,
                                 supported=tuple(KERNELS), what="the torch kernels") from None
    result = impl(kernel, args)
    outs = [result] if isinstance(result, torch.Tensor) else list(result)
    if len(outs) != len(kernel.outputs):
        raise ExecutionError(f"kernel {kernel.name!r} ({kernel.op_type}) returned {len(outs)} "
                             f"outputs, the graph expects {len(kernel.outputs)}")
    return outs
