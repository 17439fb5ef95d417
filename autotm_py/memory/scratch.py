"""Scratch: what a kernel allocates outside its planned slots when a plan runs in an arena.

In an arena run (`autotm_py.arena`, docs/gpu.md) every tensor has a planned slot, but torch's
kernels allocate by themselves: their workspaces (cuDNN, cuBLAS, temporaries of composite
kernels: `workspace_bytes` of the profile) and, unless an `out=` variant writes them straight
into their slots, their outputs, which the executor then copies into the slots. All of it comes
from torch's caching allocator in one scratch region beside the arena, as large as the largest
kernel's scratch; the planner leaves that much of the budget to it.

A kernel's scratch: its workspace, plus the bytes of each fast output that torch allocates:
every output of a kernel that can neither write in place (`DIRECT_OPS`, `writes_in_place`) nor
returns a view of an input (`VIEW_OPS`), and every output that ends a carried pair (W' of
W -> W'), which the executor writes through scratch when it takes W's slot in place, unless
the kernel is elementwise and may write over its input (`IN_PLACE_OPS`: the SGD update).

A plan for the placed allocator (`PlanConfig.placed`: `runtime.placed`, where torch allocates
a kernel's outputs at their slots) counts fewer: the outputs of `PLACED_OPS`, which their
kernels allocate at exactly their size and so get their slots, are not scratch (carried ends
still are: their slot is their input's, never offered).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotm_py.ir.rules.geometry import torch_avg_pool_ok, window

if TYPE_CHECKING:
    from autotm_py.ir.graph import Kernel, TensorGraph

# Ops whose torch kernels write every output straight into a given buffer (aten `out=`
# variants: `kernels/into.py`, which a test keeps in step). Conv does so on CUDA with cuDNN;
# elsewhere the executor copies its output, which costs time but no budget (no cap off the
# GPU).
DIRECT_OPS = frozenset({
    "Add", "Sub", "Mul", "Max", "Min", "Div", "Sum", "GradAccumulate", "Relu", "ReluGrad",
    "Gelu", "GeluGrad", "MatMul", "MatMulGradA", "MatMulGradB", "BatchNormalization", "Conv",
    "SGDUpdate", "SoftmaxCrossEntropy", "SoftmaxCrossEntropyGrad", "Linear", "LinearGrad",
    "Concat", "AveragePool", "RotaryEmbedding", "RotaryEmbeddingGrad", "Silu", "SiluGrad",
    "MulGrad", "Cast", "CastGrad", "BatchNormApply",
})
# Elementwise ops whose torch kernels (`kernels.into`) may write their output over the inputs
# at these positions, each element read before it is written (Sum: the first two only, which
# its first add reads). Without an arena the executor writes an output over an input that dies
# at its kernel (`runtime.reuse`). SGDUpdate (every form, `ir/optim.py`): W' over W or dW, and
# with momentum buf' over the buffer (position 2; there, in the lr-input form without
# momentum, the learning rate: a constant, never overwritten). BatchNormalization in training:
# the running mean' and var' over the running mean and var (positions 3 and 4), updated in
# place as torch's own batch norm updates its buffers (`kernels.into.batch_norm` checks that
# each lands on its own).
OVERWRITES: dict[str, tuple[int, ...]] = {
    "Add": (0, 1), "Sub": (0, 1), "Mul": (0, 1), "Div": (0, 1), "Max": (0, 1), "Min": (0, 1),
    "Sum": (0, 1), "GradAccumulate": (0, 1), "Relu": (0,), "ReluGrad": (0, 1), "Gelu": (0,),
    "GeluGrad": (0, 1), "SGDUpdate": (0, 1, 2), "BatchNormalization": (3, 4),
}
# Of those, the ones whose outputs the arena packing lets take their inputs' slots (the update
# of a carried weight, W -> W', and of SGD's momentum buffer; a batch norm's running
# statistics): written directly there. Before batch norm was here, each of ResNet-200's 203
# took 10 device copies a step (its running statistics cloned by torch's functional kernel,
# then copied into their slots, and its saved statistics, whose slots those clones took,
# moved out and back): 2.0 ms of its 50 ms bf16 step on an H200.
IN_PLACE_OPS = frozenset({"SGDUpdate", "BatchNormalization"})
# Ops whose torch kernels allocate every output at exactly its size, so that the placed allocator
# gives it its slot: measured on the H100 by op (experiments/journal/gpu-2026-11.md, "Outputs
# allocated at their slots": all of them placed for ResNet-200, DenseNet-264, Inception-v4 and
# BERT-base, but 3 of Inception-v4's 740 ConvGrad and BatchNormGrad outputs). Not here: layer norm's
# gradient (its weight gradients mostly land elsewhere), views, and the direct ops.
PLACED_OPS = frozenset({
    "ConvGrad", "BatchNormGrad", "MaxPool", "MaxPoolGrad", "GlobalAveragePool",
    "GlobalAveragePoolGrad", "AveragePoolGrad", "Gemm", "GemmGradA", "GemmGradB",
    "ScaledDotProductAttention", "ScaledDotProductAttentionGrad", "LayerNormalization",
    "LinearCrossEntropyGrad",  # allocates dX, dW, dB at their sizes before its block buffer
    # native_layer_norm_backward allocates dX, dgamma, dbeta at their sizes: BERT-base's bf16
    # replay copied 0.22 ms of views a step and none of its 26 fp32 dX of 48 MiB (the H200,
    # 2026-12-04, experiments/results/bf16/2026-12-04), which the planner priced as copied
    "LayerNormGrad",
    "ConvRelu",  # cuDNN's fused call allocates Y (elsewhere: the convolution's, ReLU'd in place)
    # ConvGrad's parts (`ir.conv_split`): the same convolution_backward call with one output
    # asked for, which it allocates as ConvGrad does (not measured on their own)
    "ConvGradData", "ConvGradFilter",
})
# Ops whose torch kernels return a view of an input: the executor copies the view into the
# output's slot and nothing is allocated.
VIEW_OPS = frozenset({
    "Reshape", "ReshapeGrad", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Transpose",
    "TransposeGrad",
})


# Ops whose torch kernels return views of (parts of) an input that are not its bytes in order
# (`torch.split`, `expand`; Slice too where no step is negative, `returns_views`): nothing is
# allocated; each view is copied into its slot (time, not budget). Counted as allocated until
# 2026-12-06, a U-Net's ConcatGrad in bf16 (its parts 0.5 GiB) set the smallest feasible
# budget at 89% of the peak where its working set is 57%.
PART_VIEW_OPS = frozenset({"Split", "ConcatGrad", "Expand"})


def returns_views(kernel: Kernel) -> bool:
    """Whether the torch kernel of `kernel` returns views of its input, allocating nothing:
    `PART_VIEW_OPS`, and a Slice without negative steps (a flipped slice is a new tensor)."""
    if kernel.op_type == "Slice":
        return all(int(step) > 0 for step in kernel.attr("steps") or ())
    return kernel.op_type in PART_VIEW_OPS


def writes_in_place(graph: TensorGraph, kernel: Kernel) -> bool:
    """Whether the executor's torch kernel writes the outputs of `kernel` into their slots (on
    CUDA) without allocating them: `DIRECT_OPS`, with the attributes that the direct path of
    `kernels/into.py` handles."""
    if kernel.op_type not in DIRECT_OPS:
        return False
    if kernel.op_type == "BatchNormalization":  # training, on cuDNN's pair or the native one
        return bool(kernel.attr("training_mode", 0))
    if kernel.op_type == "Conv":  # cuDNN pads symmetrically; explicit padding would copy
        x, w = (graph.tensors[t].shape for t in kernel.inputs[:2])
        geo = window(dict(kernel.attrs), x[2:], w[2:])
        return geo.begins == geo.ends
    if kernel.op_type == "AveragePool":  # aten's 2-d and 3-d pools, symmetric pads
        x = graph.tensors[kernel.inputs[0]].shape
        geo = window(dict(kernel.attrs), x[2:])
        return geo.nd in (2, 3) and torch_avg_pool_ok(geo)
    if kernel.op_type == "SGDUpdate":  # weight decay and Nesterov allocate a temporary
        return not (kernel.attr("weight_decay", 0) or kernel.attr("nesterov", 0))
    if kernel.op_type in ("Concat", "RotaryEmbedding", "RotaryEmbeddingGrad"):  # one dtype
        return len({graph.tensors[t].dtype for t in (*kernel.inputs, *kernel.outputs)}) == 1
    if kernel.op_type in ("SoftmaxCrossEntropy", "SoftmaxCrossEntropyGrad"):
        return _plain_cross_entropy(graph, kernel)
    if kernel.op_type in ("MatMulGradA", "MatMulGradB"):
        return _plain_matmul_grad(graph, kernel)
    if kernel.op_type == "MulGrad":  # no broadcast operand to sum back; one dtype
        shapes = [graph.tensors[t].shape for t in (*kernel.inputs, *kernel.outputs)]
        dtypes = {graph.tensors[t].dtype for t in (*kernel.inputs, *kernel.outputs)}
        return len(set(shapes)) == 1 and len(dtypes) == 1
    return True


def _plain_matmul_grad(graph: TensorGraph, kernel: Kernel) -> bool:
    """One GEMM: dA = dY B^T with a matrix B and no broadcast batch axes, or dB = A^T dY over
    rows folded from every batch axis into a matrix dB."""
    dy, other = (graph.tensors[t].shape for t in kernel.inputs)
    out = graph.tensors[kernel.outputs[0]].shape
    if kernel.op_type == "MatMulGradA":
        return len(other) == 2 and len(dy) == len(out) >= 2 and dy[:-1] == out[:-1]
    return len(out) == 2 and len(other) == len(dy) >= 2


def _plain_cross_entropy(graph: TensorGraph, kernel: Kernel) -> bool:
    """Our loss with class weights absent, the mean reduction and classes on the last axis
    (what `kernels/into.py` writes in place)."""
    scores = graph.tensors[kernel.inputs[0]]
    axis = int(kernel.attr("axis", 1 if kernel.domain == "" else -1)) % len(scores.shape)
    outputs = 2 if kernel.op_type == "SoftmaxCrossEntropy" else 1
    return (len(kernel.inputs) == 2 and len(kernel.outputs) == outputs
            and str(kernel.attr("reduction", "mean")) == "mean"
            and axis == len(scores.shape) - 1 and kernel.attr("ignore_index") is None)


def allocated_outputs(graph: TensorGraph, kernel: Kernel, placed: bool = False) -> list[int]:
    """The outputs of `kernel` that torch allocates in an arena run outside their slots
    (`placed`: under the placed allocator; module docstring)."""
    direct = writes_in_place(graph, kernel)
    carried_ends = set() if direct and kernel.op_type in IN_PLACE_OPS else \
        {last for _, last in graph.carried}
    copied = kernel.op_type not in VIEW_OPS and not returns_views(kernel) and \
        not direct and not (placed and kernel.op_type in PLACED_OPS)
    return [t for t in kernel.outputs if copied or t in carried_ends]


def copied_outputs(graph: TensorGraph, kernel: Kernel, placed: bool = False) -> list[int]:
    """The outputs of `kernel` that the executor copies into their slots in an arena run:
    those torch allocates elsewhere, and views of parts of an input (`returns_views`)."""
    if returns_views(kernel):
        return list(kernel.outputs)
    return allocated_outputs(graph, kernel, placed)
