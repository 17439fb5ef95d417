"""Direct outputs for arena runs: kernels that write their outputs into given buffers.

In an arena run (docs/gpu.md) each output has a planned slot. For the ops of
`memory.scratch.DIRECT_OPS` the executor passes the slots to `run_kernel_into`, which writes
the outputs there through aten `out=` variants, computing exactly what `run_kernel` computes
(bitwise: tests/test_into.py), so nothing is allocated and nothing copied. Every other kernel
runs as usual and the executor copies its outputs into their slots.

An implementation returns False, having written nothing, when it cannot write in place (a
dtype it does not handle, Conv off CUDA, a batch norm in inference mode); the caller then
runs the kernel and copies. Ops with no entry here run and are copied too: among them ConvGrad
(aten's `convolution_backward.out` is a generated wrapper that allocates and copies, as the
executor's copy does), the batch-norm gradient (so are `cudnn_batch_norm_backward.out` and
`native_batch_norm_backward.out`: `experiments/gpu/out_variant_probe.py`), attention and layer
norm.
`memory.scratch.writes_in_place` says, without torch, which kernels are written in place on
CUDA, so that the planner leaves scratch for the others.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from autotm_py.ir.graph import Kernel
from autotm_py.ir.rules.geometry import torch_avg_pool_ok, window
from autotm_py.kernels.batch_norm import batch_norm_apply, batch_norm_training_into
from autotm_py.kernels.decoder import rotary_grad_into, rotary_into, rotary_tables
from autotm_py.kernels.grad_tensor import decayed_grad, descend, learning_rate
from autotm_py.kernels.loss_grad import fused_softmax_grad
from autotm_py.kernels.nn import cudnn_window
from autotm_py.kernels.util import (
    attrs,
    log_softmax_rows,
    loss_dtype,
    overlaps,
    softmax_grad_rows,
    torch_dtype,
)

Tensors = Sequence[torch.Tensor]
IntoImpl = Callable[[Kernel, Tensors, Tensors], bool]
INTO: dict[str, IntoImpl] = {}
A = torch.ops.aten


def into(*ops: str) -> Callable[[IntoImpl], IntoImpl]:
    def deco(fn: IntoImpl) -> IntoImpl:
        for op in ops:
            INTO[op] = fn
        return fn

    return deco


def run_kernel_into(kernel: Kernel, args: Tensors, outs: Sequence[torch.Tensor | None]) -> bool:
    """Write the outputs of `kernel` into `outs` (contiguous, of the graph's shapes and dtypes)
    if a direct implementation applies; False, with nothing written, if none does."""
    impl = INTO.get(kernel.op_type)
    if impl is None or any(o is None for o in outs) or len(outs) != len(kernel.outputs):
        return False
    return impl(kernel, args, outs)  # type: ignore[arg-type]


# ---- elementwise ------------------------------------------------------------------------
BINARY_OUT = {"Add": torch.add, "Sub": torch.sub, "Mul": torch.mul, "Max": torch.maximum,
              "Min": torch.minimum}


@into(*BINARY_OUT)
def binary(k: Kernel, args: Tensors, outs: Tensors) -> bool:
    a, b = args
    if outs[0].dtype != torch.result_type(a, b):
        return False
    BINARY_OUT[k.op_type](a, b, out=outs[0])
    return True


@into("Div")
def div(k: Kernel, args: Tensors, outs: Tensors) -> bool:
    a, b = args
    if outs[0].dtype != torch.result_type(a, b):
        return False
    if a.dtype.is_floating_point:
        torch.div(a, b, out=outs[0])
    else:
        torch.div(a, b, rounding_mode="trunc", out=outs[0])
    return True


@into("Sum", "GradAccumulate")
def sum_(k: Kernel, args: Tensors, outs: Tensors) -> bool:
    out = outs[0]
    if len(args) == 1:
        out.copy_(args[0])
        return True
    if out.dtype != torch.result_type(args[0], args[1]):
        return False
    torch.add(args[0], args[1], out=out)  # the same left-to-right sums as functools.reduce
    for arg in args[2:]:
        torch.add(out, arg, out=out)
    return True


@into("Relu")
def relu(k: Kernel, args: Tensors, outs: Tensors) -> bool:
    torch.clamp_min(args[0], 0, out=outs[0])  # what torch.relu computes
    return True


@into("ReluGrad")
def relu_grad(k: Kernel, args: Tensors, outs: Tensors) -> bool:
    A.threshold_backward.grad_input(args[0], args[1], 0, grad_input=outs[0])
    return True


@into("Gelu")
def gelu(k: Kernel, args: Tensors, outs: Tensors) -> bool:
    A.gelu.out(args[0], approximate=str(k.attr("approximate", "none")), out=outs[0])
    return True


@into("GeluGrad")
def gelu_grad(k: Kernel, args: Tensors, outs: Tensors) -> bool:
    A.gelu_backward.grad_input(args[0], args[1], approximate=str(k.attr("approximate", "none")),
                               grad_input=outs[0])
    return True


@into("Silu")
def silu(k: Kernel, args: Tensors, outs: Tensors) -> bool:
    A.silu.out(args[0], out=outs[0])  # what F.silu computes
    return True


@into("SiluGrad")
def silu_grad(k: Kernel, args: Tensors, outs: Tensors) -> bool:
    A.silu_backward.grad_input(args[0], args[1], grad_input=outs[0])
    return True


@into("MulGrad")
def mul_grad(k: Kernel, args: Tensors, outs: Tensors) -> bool:
    """dY * other where nothing is summed: the product has the gradient's shape (a SwiGLU's
    gate and up gradients; a broadcast operand's gradient is reduced and copied instead)."""
    dy, other = args
    out = outs[0]
    if out.dtype != torch.result_type(dy, other) or \
            tuple(out.shape) != tuple(torch.broadcast_shapes(dy.shape, other.shape)):
        return False
    torch.mul(dy, other, out=out)
    return True


@into("Cast", "CastGrad")
def cast(k: Kernel, args: Tensors, outs: Tensors) -> bool:
    """A bf16 graph's casts (a master weight to its bf16 copy, a bf16 gradient back to fp32,
    an activation across autocast's lists) converted straight into the slot: the copy kernel
    `.to` runs, without its allocation. Under the placed allocator `.to`'s output landed in
    the slot too, but the planner priced every cast as copied there after the kernel: with
    `LayerNormGrad`'s outputs, 3.9 ms of BERT-base b32's bf16 all-fast prediction (53.30 ->
    49.43 ms) that no replay spent (the H200, 2026-12-04: no copies beside the casts' own
    kernels in the trace)."""
    x, out = args[0], outs[0]
    if tuple(out.shape) != tuple(x.shape):
        return False
    out.copy_(x)
    return True


@into("SGDUpdate")
def sgd_update(k: Kernel, args: Tensors, outs: Tensors) -> bool:
    """Every form of `grad_tensor.sgd_update`, its operations in its order. An output may be
    written over W or dW (`memory.scratch.OVERWRITES`): weight decay and Nesterov take a
    temporary first, and W' is written last; buf' only over buf (its `mul` writes before its
    `add_` reads dW)."""
    w, g = args[0], args[1]
    lr = learning_rate(k, args)
    g = decayed_grad(k, w, g)
    momentum = float(k.attr("momentum", 0.0))
    if momentum:
        buf, buf_out = args[2], outs[1]
        if (overlaps(buf_out, buf) and not _same(buf_out, buf)) or \
                any(overlaps(buf_out, t) for t in (w, args[1], outs[0])):
            return False
        torch.mul(buf, momentum, out=buf_out).add_(g, alpha=1.0)
        g = g.add(buf_out, alpha=momentum) if k.attr("nesterov", 0) else buf_out
    descend(w, g, lr, out=outs[0])
    return True


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() and a.numel() == b.numel() and a.dtype == b.dtype


# ---- concatenation and pooling ------------------------------------------------------------
@into("Concat")
def concat(k: Kernel, args: Tensors, outs: Tensors) -> bool:
    if any(a.dtype != outs[0].dtype for a in args):
        return False
    torch.cat(list(args), int(k.attr("axis")), out=outs[0])
    return True


AVG_POOL_OUT = {2: A.avg_pool2d.out, 3: A.avg_pool3d.out}


@into("AveragePool")
def average_pool(k: Kernel, args: Tensors, outs: Tensors) -> bool:
    """The path of `kernels.nn.average_pool` that torch's pools take (symmetric pads, no
    dilation), through aten's `out=` twins of `F.avg_pool2d` / `avg_pool3d`."""
    x = args[0]
    geo = window(attrs(k), x.shape[2:])
    if geo.nd not in AVG_POOL_OUT or not torch_avg_pool_ok(geo):
        return False
    AVG_POOL_OUT[geo.nd](x, list(geo.kernel), list(geo.strides), list(geo.begins),
                         bool(k.attr("ceil_mode", 0)), bool(k.attr("count_include_pad", 0)),
                         None, out=outs[0])
    return True


# ---- matrix products, convolution, normalization -----------------------------------------
@into("MatMul")
def matmul(k: Kernel, args: Tensors, outs: Tensors) -> bool:
    """The GEMMs torch.matmul runs for these shapes: a folded into rows against a matrix, or
    a batch of matrices against a batch of the same size."""
    a, b = args
    out = outs[0]
    if not (a.is_contiguous() and b.is_contiguous()) or a.dim() < 2 or b.dim() < 2:
        return False
    if b.dim() == 2:
        torch.mm(a.reshape(-1, a.shape[-1]), b, out=out.view(-1, b.shape[-1]))
        return True
    if a.dim() == b.dim() and a.shape[:-2] == b.shape[:-2]:
        m, n = a.shape[-2], b.shape[-1]
        torch.bmm(a.reshape(-1, m, a.shape[-1]), b.reshape(-1, b.shape[-2], n),
                  out=out.view(-1, m, n))
        return True
    return False


@into("MatMulGradA")
def matmul_grad_a(k: Kernel, args: Tensors, outs: Tensors) -> bool:
    """dA = dY B^T as one GEMM over the rows of dY (B a matrix, no broadcast batch axes)."""
    dy, b = args
    out = outs[0]
    if b.dim() != 2 or dy.dim() != out.dim() or dy.shape[:-1] != out.shape[:-1] or \
            not dy.is_contiguous():
        return False
    torch.mm(dy.reshape(-1, dy.shape[-1]), b.transpose(-1, -2), out=out.view(-1, b.shape[0]))
    return True


@into("MatMulGradB")
def matmul_grad_b(k: Kernel, args: Tensors, outs: Tensors) -> bool:
    """dB = A^T dY over every row of A and dY (a matrix dB)."""
    dy, a = args
    out = outs[0]
    if out.dim() != 2 or a.dim() != dy.dim() or a.dim() < 2 or not (a.is_contiguous() and
                                                                 dy.is_contiguous()):
        return False
    torch.mm(a.reshape(-1, a.shape[-1]).t(), dy.reshape(-1, dy.shape[-1]), out=out)
    return True


@into("Linear")
def linear(k: Kernel, args: Tensors, outs: Tensors) -> bool:
    """One addmm (mm without a bias) over the rows of X into the slot, as `kernels.fused`."""
    x, w = args[0], args[1]
    if not x.is_contiguous():
        return False
    w = w.t() if k.attr("transB", 0) else w
    rows = outs[0].view(-1, w.shape[1])
    if len(args) < 3:
        torch.mm(x.reshape(-1, x.shape[-1]), w, out=rows)
    else:
        torch.addmm(args[2].reshape(-1), x.reshape(-1, x.shape[-1]), w, out=rows)
    return True


@into("LinearGrad")
def linear_grad(k: Kernel, args: Tensors, outs: Tensors) -> bool:
    """dX and dW with one mm each, dB as the row sum of dY, each into its slot (the outputs
    that `output_mask` asks for, in order)."""
    dy, x, w = args
    if not (dy.is_contiguous() and x.is_contiguous()):
        return False
    mask = k.attr("output_mask", (1, 1, 0))
    trans = bool(k.attr("transB", 0))
    dy_rows = dy.reshape(-1, dy.shape[-1])
    slots = iter(outs)
    if mask[0]:
        torch.mm(dy_rows, w if trans else w.t(), out=next(slots).view(-1, x.shape[-1]))
    if mask[1]:
        rows = x.reshape(-1, x.shape[-1])
        out = next(slots)
        if trans:
            torch.mm(dy_rows.t(), rows, out=out)
        else:
            torch.mm(rows.t(), dy_rows, out=out)
    if mask[2]:
        torch.sum(dy_rows, 0, out=next(slots).view(-1))
    return True


@into("RotaryEmbedding", "RotaryEmbeddingGrad")
def rotary(k: Kernel, args: Tensors, outs: Tensors) -> bool:
    """The product and the two addcmul_ of `kernels.decoder` straight into the slot (operands
    and output of one dtype, the output of the broadcast shape)."""
    a = args[0]
    cos, sin = rotary_tables(k, args[1], args[2])
    out = outs[0]
    if len({a.dtype, cos.dtype, sin.dtype, out.dtype}) != 1 or \
            tuple(out.shape) != tuple(torch.broadcast_shapes(a.shape, cos.shape, sin.shape)):
        return False
    (rotary_into if k.op_type == "RotaryEmbedding" else rotary_grad_into)(out, a, cos, sin)
    return True


@into("Conv")
def conv(k: Kernel, args: Tensors, outs: Tensors) -> bool:
    """cuDNN writes the convolution into the slot, as aten's convolution runs it on CUDA
    (then adds the bias in place); elsewhere (CPU, grouped, asymmetric pads) the caller
    copies."""
    x, w = args[0], args[1]
    geo = cudnn_window(k, x, w)
    if geo is None:
        return False
    deterministic = torch.backends.cudnn.deterministic or \
        torch.are_deterministic_algorithms_enabled()
    chunks = int(k.attr("batch_chunks", 1))  # `ir.conv_split`: slices of the batch in turn
    for x_part, out in zip(x.tensor_split(chunks), outs[0].tensor_split(chunks), strict=True):
        A.cudnn_convolution.out(x_part, w, list(geo.begins), list(geo.strides),
                                list(geo.dilations), 1, torch.backends.cudnn.benchmark,
                                deterministic, torch.backends.cudnn.allow_tf32, out=out)
    if len(args) > 2:
        outs[0].add_(args[2].reshape(1, -1, 1, 1))
    return True


@into("BatchNormalization")
def batch_norm(k: Kernel, args: Tensors, outs: Tensors) -> bool:
    """Training mode, on whichever pair torch runs (`kernels.batch_norm`: cuDNN's or the
    native one); missing outputs go to small temporaries."""
    x, scale, bias, mean, var = args
    if not k.attr("training_mode", 0):
        return False
    # an output may meet an input only as a running statistic over its own old value
    # (`memory.scratch.OVERWRITES`), which the kernel reads before it writes
    if any(overlaps(out, arg) and (o, a) not in ((1, 3), (2, 4))
           for o, out in enumerate(outs) if out is not None for a, arg in enumerate(args)):
        return False
    eps, momentum = float(k.attr("epsilon", 1e-5)), float(k.attr("momentum", 0.9))
    slots = list(outs) + [None] * (5 - len(outs))
    buffers = tuple(s if s is not None else torch.empty_like(ref)
                    for s, ref in zip(slots, (x, mean, var, mean, mean), strict=True))
    batch_norm_training_into(x, scale, bias, mean, var, 1.0 - momentum, eps, buffers)
    return True


@into("BatchNormApply")
def batch_norm_again(k: Kernel, args: Tensors, outs: Tensors) -> bool:
    """A training-mode batch norm's re-run (`ir.rerun`) into its slot."""
    if any(overlaps(outs[0], arg) for arg in args):
        return False
    batch_norm_apply(*args, eps=float(k.attr("epsilon", 1e-5)), out=outs[0])
    return True


# ---- loss ----------------------------------------------------------------------------------
@into("SoftmaxCrossEntropy")
def softmax_cross_entropy(k: Kernel, args: Tensors, outs: Tensors) -> bool:
    """Loss and log-probabilities with classes on the last axis, no class weights, the mean
    reduction (`memory.scratch.writes_in_place`); ours on bf16 logits in fp32, as
    `nn.softmax_cross_entropy` (torch's upcast copy is the kernel's workspace)."""
    scores, labels = args[0], args[1]
    axis = int(k.attr("axis", 1 if k.domain == "" else -1)) % scores.dim()
    if len(args) > 2 or len(outs) != 2 or axis != scores.dim() - 1 or \
            str(k.attr("reduction", "mean")) != "mean" or k.attr("ignore_index") is not None:
        return False
    loss, log_prob = outs
    if log_prob.dtype == scores.dtype:
        A._log_softmax.out(scores, axis, False, out=log_prob)
    elif k.domain and log_prob.dtype == loss_dtype(scores.dtype):
        log_softmax_rows(scores, axis, out=log_prob)
    else:
        return False
    total = torch.empty((), dtype=log_prob.dtype, device=scores.device)
    A.nll_loss_forward.output(log_prob.reshape(-1, scores.shape[-1]),
                              labels.reshape(-1).long(), None, 1, -100, output=loss,
                              total_weight=total)
    return True


@into("SoftmaxCrossEntropyGrad")
def softmax_cross_entropy_grad(k: Kernel, args: Tensors, outs: Tensors) -> bool:
    log_prob, labels = args[0], args[1]
    axis = int(k.attr("axis", -1)) % log_prob.dim()
    if len(args) > 2 or axis != log_prob.dim() - 1 or k.attr("ignore_index") is not None or \
            str(k.attr("reduction", "mean")) != "mean":
        return False
    rows = log_prob.reshape(-1, log_prob.shape[-1])
    grad = outs[0].view(rows.shape)
    if grad.dtype != torch_dtype(k.attr("to", str(rows.dtype).split(".")[-1])):
        return False
    lab = labels.reshape(-1).long()
    if fused_softmax_grad(rows, lab, 1.0 / lab.numel(), grad) is not None:
        return True
    coef = torch.ones(lab.shape, dtype=rows.dtype, device=rows.device)
    coef = coef / coef.sum()
    if grad.dtype == rows.dtype:
        softmax_grad_rows(torch.exp(rows, out=grad), lab, coef.unsqueeze(1))
    else:  # fp32 softmax (a temporary: the kernel's workspace), rounded once into bf16
        softmax_grad_rows(rows.exp(), lab, coef.unsqueeze(1), grad)
    return True
