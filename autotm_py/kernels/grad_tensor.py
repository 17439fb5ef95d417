"""Backward torch kernels of elementwise ops, reductions and data movement, and the optimizer
updates. Formulas follow PyTorch's autograd derivatives (tie-splitting of max/min, pow at 0),
so the results match torch.autograd on the same forward kernels."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from autotm_py.ir.graph import Kernel
from autotm_py.kernels.tensor import pad_indices, slice_index
from autotm_py.kernels.util import negate, pad_spec, register, sum_to

Tensors = Sequence[torch.Tensor]


def _shape(k: Kernel) -> tuple[int, ...]:
    return tuple(int(s) for s in k.attr("shape"))


# ---- elementwise ------------------------------------------------------------------------
@register("SumToShape")
def sum_to_shape(k: Kernel, args: Tensors) -> torch.Tensor:
    g = sum_to(args[0], _shape(k))
    scale = float(k.attr("scale", 1.0))
    return g if scale == 1.0 else g * scale


@register("MulGrad")
def mul_grad(k: Kernel, args: Tensors) -> torch.Tensor:
    return sum_to(args[0] * args[1], _shape(k))


@register("DivGradA")
def div_grad_a(k: Kernel, args: Tensors) -> torch.Tensor:
    return sum_to(args[0] / args[1], _shape(k))


@register("DivGradB")
def div_grad_b(k: Kernel, args: Tensors) -> torch.Tensor:
    dy, a, b = args
    return sum_to(-dy * ((a / b) / b), _shape(k))


@register("PowGradBase")
def pow_grad_base(k: Kernel, args: Tensors) -> torch.Tensor:
    dz, x, e = args
    g = torch.where(e == 0, torch.zeros((), dtype=dz.dtype, device=dz.device),
                    dz * (e * x.pow(e - 1)))
    return sum_to(g, _shape(k))


@register("PowGradExponent")
def pow_grad_exponent(k: Kernel, args: Tensors) -> torch.Tensor:
    """dZ * Z * log X, and 0 where X == 0 with a finite result (exponent >= 0), as torch."""
    dz, x, z = args
    zero_base = (x == 0) & torch.isfinite(z)
    g = dz * torch.where(zero_base, torch.zeros((), dtype=z.dtype, device=z.device),
                         z * x.log())
    return sum_to(g, _shape(k))


@register("MaxMinGrad")
def max_min_grad(k: Kernel, args: Tensors) -> torch.Tensor:
    dy, a, b = args
    slot, is_max = int(k.attr("slot")), k.attr("op") == "Max"
    wins = (a > b) if is_max == (slot == 0) else (a < b)
    zero = torch.zeros((), dtype=dy.dtype, device=dy.device)
    g = torch.where(a == b, dy / 2, torch.where(wins, dy, zero))
    return sum_to(g, _shape(k))


@register("WhereGrad")
def where_grad(k: Kernel, args: Tensors) -> torch.Tensor:
    dy, cond = args
    zero = torch.zeros((), dtype=dy.dtype, device=dy.device)
    g = torch.where(cond, dy, zero) if int(k.attr("slot")) == 1 else torch.where(cond, zero, dy)
    return sum_to(g, _shape(k))


@register("ReluGrad")
def relu_grad(k: Kernel, args: Tensors) -> torch.Tensor:
    return torch.ops.aten.threshold_backward(args[0], args[1], 0)


@register("LeakyReluGrad")
def leaky_relu_grad(k: Kernel, args: Tensors) -> torch.Tensor:
    return torch.ops.aten.leaky_relu_backward(args[0], args[1], float(k.attr("alpha")), False)


@register("SigmoidGrad")
def sigmoid_grad(k: Kernel, args: Tensors) -> torch.Tensor:
    return torch.ops.aten.sigmoid_backward(args[0], args[1])


@register("TanhGrad")
def tanh_grad(k: Kernel, args: Tensors) -> torch.Tensor:
    return torch.ops.aten.tanh_backward(args[0], args[1])


@register("GeluGrad")
def gelu_grad(k: Kernel, args: Tensors) -> torch.Tensor:
    return torch.ops.aten.gelu_backward(args[0], args[1],
                                        approximate=str(k.attr("approximate", "none")))


@register("ErfGrad")
def erf_grad(k: Kernel, args: Tensors) -> torch.Tensor:
    dy, x = args
    return 2.0 / math.sqrt(math.pi) * torch.exp(-(x * x)) * dy


@register("SqrtGrad")
def sqrt_grad(k: Kernel, args: Tensors) -> torch.Tensor:
    return args[0] / (2 * args[1])


@register("ReciprocalGrad")
def reciprocal_grad(k: Kernel, args: Tensors) -> torch.Tensor:
    dy, y = args
    return -dy * (y * y)


@register("ExpGrad")
def exp_grad(k: Kernel, args: Tensors) -> torch.Tensor:
    return args[0] * args[1]


@register("LogGrad")
def log_grad(k: Kernel, args: Tensors) -> torch.Tensor:
    return args[0] / args[1]


@register("AbsGrad")
def abs_grad(k: Kernel, args: Tensors) -> torch.Tensor:
    return args[0] * args[1].sgn()


@register("ClipGrad")
def clip_grad(k: Kernel, args: Tensors) -> torch.Tensor:
    dy, x = args
    low, high = k.attr("min"), k.attr("max")
    keep = torch.ones_like(x, dtype=torch.bool)
    if low is not None:
        keep = keep & (x >= low)
    if high is not None:
        keep = keep & (x <= high)
    return dy * keep


@register("DropoutGrad")
def dropout_grad(k: Kernel, args: Tensors) -> torch.Tensor:
    ratio = float(k.attr("ratio"))
    return torch.ops.aten.native_dropout_backward(args[0], args[1], 1.0 / (1.0 - ratio))


# ---- reductions and data movement -------------------------------------------------------
def _unreduced(k: Kernel, dy: torch.Tensor) -> torch.Tensor:
    shape = _shape(k)
    if not int(k.attr("keepdims", 1)):
        kept = list(shape)
        for axis in k.attr("axes"):
            kept[int(axis)] = 1
        dy = dy.reshape(kept)
    return dy.expand(shape)


@register("ReduceSumGrad")
def reduce_sum_grad(k: Kernel, args: Tensors) -> torch.Tensor:
    return _unreduced(k, args[0]).contiguous()


@register("ReduceMeanGrad")
def reduce_mean_grad(k: Kernel, args: Tensors) -> torch.Tensor:
    shape = _shape(k)
    count = math.prod(shape[int(a)] for a in k.attr("axes"))
    return _unreduced(k, args[0]) / count


@register("ConcatGrad")
def concat_grad(k: Kernel, args: Tensors) -> tuple[torch.Tensor, ...]:
    parts = torch.split(args[0], [int(s) for s in k.attr("sizes")], int(k.attr("axis")))
    return tuple(parts[int(i)] for i in k.attr("keep"))


@register("SplitGrad")
def split_grad(k: Kernel, args: Tensors) -> torch.Tensor:
    axis, sizes = int(k.attr("axis")), [int(s) for s in k.attr("sizes")]
    given = dict(zip((int(i) for i in k.attr("present")), args, strict=True))
    ref = args[0]
    parts = []
    for i, size in enumerate(sizes):
        if i in given:
            parts.append(given[i])
            continue
        shape = list(ref.shape)
        shape[axis] = size
        parts.append(ref.new_zeros(shape))
    return torch.cat(parts, axis)


@register("SliceGrad")
def slice_grad(k: Kernel, args: Tensors) -> torch.Tensor:
    dy = args[0]
    ranges = list(zip(*(k.attr(n) for n in ("axes", "starts", "ends", "steps")), strict=True))
    dx = dy.new_zeros(_shape(k))
    index, flips = slice_index(dx.dim(), ranges)
    dx[index] = dy.flip(flips) if flips else dy
    return dx


@register("GatherGrad")
def gather_grad(k: Kernel, args: Tensors) -> torch.Tensor:
    """Scatter-add through aten.embedding_dense_backward (deterministic on CUDA too)."""
    dy, idx = args
    shape, axis = _shape(k), int(k.attr("axis"))
    n = shape[axis]
    before, after = math.prod(shape[:axis]), math.prod(shape[axis + 1:])
    idx = torch.where(idx < 0, idx + n, idx).long().reshape(-1)
    rows = dy.reshape(before, idx.numel(), after)
    rows = rows.transpose(0, 1).reshape(idx.numel(), before * after)
    table = torch.ops.aten.embedding_dense_backward(rows, idx, n, -1, False)
    table = table.reshape(n, before, after).transpose(0, 1)
    return table.reshape(shape)


@register("TileGrad")
def tile_grad(k: Kernel, args: Tensors) -> torch.Tensor:
    dy = args[0]
    shape, repeats = _shape(k), [int(r) for r in k.attr("repeats")]
    split = [d for pair in zip(repeats, shape, strict=True) for d in pair]
    return dy.reshape(split).sum(dim=tuple(range(0, 2 * len(shape), 2)))


@register("PadGrad")
def pad_grad(k: Kernel, args: Tensors) -> torch.Tensor:
    dy = args[0]
    shape, pads = _shape(k), [int(p) for p in k.attr("pads")]
    mode = str(k.attr("mode", "constant"))
    if mode == "constant":
        return F.pad(dy, pad_spec(negate(pads)))
    rank = len(shape)
    for axis in range(rank - 1, -1, -1):
        before, after = pads[axis], pads[rank + axis]
        if before or after:
            idx = pad_indices(shape[axis], before, after, mode, dy.device)
            grad_shape = list(dy.shape)
            grad_shape[axis] = shape[axis]
            dy = dy.new_zeros(grad_shape).index_add_(axis, idx, dy)
    return dy


# ---- optimizers (ir/optim.py) ------------------------------------------------------------
LearningRate = float | torch.Tensor


def learning_rate(k: Kernel, args: Tensors) -> LearningRate:
    """The kernel's learning rate: its `lr` attribute, else its last input, a float32 scalar
    tensor (`Optimizer.lr_input`). On the CPU that tensor's value as a Python float: torch's
    own scalar path, bit for bit. Elsewhere the device tensor itself, used by device
    arithmetic: reading it back to the host (`.item()`, `float()`) would synchronize with the
    device and break the capture of a CUDA graph."""
    lr = k.attr("lr")
    if lr is not None:
        return float(lr)
    t = args[-1]
    return float(t) if t.device.type == "cpu" else t


def descend(w: torch.Tensor, d: torch.Tensor, lr: LearningRate,
            out: torch.Tensor | None = None) -> torch.Tensor:
    """W - lr * d as torch.optim.SGD's `param.add_(d, alpha=-lr)` (one `add`); a device
    tensor lr multiplies on the device (`addcmul`, one kernel, no synchronization)."""
    if isinstance(lr, float):
        return torch.add(w, d, alpha=-lr) if out is None else \
            torch.add(w, d, alpha=-lr, out=out)
    return torch.addcmul(w, d, lr, value=-1) if out is None else \
        torch.addcmul(w, d, lr, value=-1, out=out)


def decayed_grad(k: Kernel, w: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """torch's L2 weight decay, `grad.add(param, alpha=weight_decay)` (SGD, Adam)."""
    wd = float(k.attr("weight_decay", 0.0))
    return g.add(w, alpha=wd) if wd else g


@register("SGDUpdate")
def sgd_update(k: Kernel, args: Tensors) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """W, dW[, buf][, lr] -> W'[, buf'], in torch.optim.SGD's single-tensor order:
    `grad = grad.add(W, alpha=wd)`; `buf = buf * momentum + grad` (`mul`, `add_` with alpha
    1 - dampening, dampening being 0); `grad = grad.add(buf, alpha=momentum)` (nesterov) or
    `grad = buf`; `W' = W.add(grad, alpha=-lr)`. The buffer starts at zero, so the first step
    gives torch's `buf = grad` exactly. Plain SGD (W, dW, the `lr` attribute) is one `add`."""
    w, g = args[0], args[1]
    lr = learning_rate(k, args)
    g = decayed_grad(k, w, g)
    momentum = float(k.attr("momentum", 0.0))
    if not momentum:
        return descend(w, g, lr)
    buf = (args[2] * momentum).add_(g, alpha=1.0)
    step = g.add(buf, alpha=momentum) if k.attr("nesterov", 0) else buf
    return descend(w, step, lr), buf


@register("AdamStep")
def adam_step(k: Kernel, args: Tensors) -> tuple[torch.Tensor, torch.Tensor]:
    """step[, lr] -> step' = step + 1, and torch.optim.Adam's per-step constants (its
    capturable form, with the bias corrections in double): coef = [sqrt(1 - b2^t) * -lr /
    (1 - b1^t), eps / (-lr / (1 - b1^t))], computed once for all weights, on the device (a
    device-tensor lr too: nothing is read back to the host)."""
    step = args[0] + 1
    t = step.double()
    lr, eps = learning_rate(k, args), float(k.attr("epsilon"))
    bias1 = 1 - torch.pow(float(k.attr("beta1")), t)
    bias2 = 1 - torch.pow(float(k.attr("beta2")), t)
    neg_step_size = -((lr if isinstance(lr, float) else lr.double()) / bias1)
    coef = torch.stack([bias2.sqrt() * neg_step_size, eps / neg_step_size])
    return step, coef.to(args[0].dtype)


@register("AdamUpdate")
def adam_update(k: Kernel, args: Tensors) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """W, dW, m, v, coef[, lr] -> W', m', v': W' = W - lr * m_hat / (sqrt(v_hat) + eps), as
    torch.optim.Adam (7 elementwise ops). `weight_decay`: L2, `grad.add(W, alpha=wd)` first
    (Adam), or with `decoupled_weight_decay` (AdamW) `W * (1 - lr * wd)` first, the factor
    in double as torch computes it from a float lr (the lr input: its last input)."""
    w, g, m, v, coef = args[:5]
    beta1, beta2 = float(k.attr("beta1")), float(k.attr("beta2"))
    if k.attr("decoupled_weight_decay", 0):
        lr, wd = learning_rate(k, args), float(k.attr("weight_decay"))
        w = w * (1 - lr * wd if isinstance(lr, float) else 1 - lr.double() * wd)
    else:
        g = decayed_grad(k, w, g)
    m_next = torch.lerp(m, g, 1 - beta1)
    v_next = (v * beta2).addcmul_(g, g, value=1 - beta2)
    denom = (v_next.sqrt() / coef[0]).add_(coef[1])
    return torch.addcdiv(w, m_next, denom), m_next, v_next


def fusable_lists(*lists: list[torch.Tensor]) -> bool:
    """Whether a multi-tensor kernel takes these lists (weights, gradients, buffers): one
    dtype, every tensor dense, and the tensors of one weight laid out alike (torch's fast-path
    restrictions: it updates each weight's tensors element by element in memory order). A
    channels-last weight qualifies with its channels-last gradient and buffer; row-major
    alone was asked before 2026-12-04, which ran a bf16 channels-last CNN's updates one by one
    (ResNet-200: 611 launches, 3.1 ms a step on the H200) once its casts kept the layout."""
    lists = tuple(ts for ts in lists if ts)
    if not lists:
        return True
    dtype = lists[0][0].dtype
    for tensors in zip(*lists, strict=True):
        stride = tensors[0].stride()
        for t in tensors:
            if t.dtype != dtype or t.stride() != stride or not (
                    t.is_contiguous() or t.is_contiguous(memory_format=torch.channels_last)):
                return False
    return True


def sgd_update_many(weights: list[torch.Tensor], grads: list[torch.Tensor],
                    bufs: list[torch.Tensor], lr: LearningRate, momentum: float = 0.0,
                    weight_decay: float = 0.0, nesterov: bool = False) -> bool:
    """Many SGD updates of one form (`runtime.reuse.sgd_form`) in place, W (and buf) written
    over, as multi-tensor kernels (a few launches for all weights instead of one per weight,
    as torch.optim.SGD's foreach and fused paths). Returns False, having written nothing,
    where no multi-tensor kernel computes it as `sgd_update` does.

    - a float lr, plain SGD: `torch._foreach_add_(W, dW, alpha=-lr)`, `descend`'s `add` per
      element, bit for bit (the CPU's path: `learning_rate` gives the CPU a float);
    - a device-tensor lr (any form, CUDA): `torch._fused_sgd_` with the lr tensor, which reads
      the lr on the device (no synchronization, capturable in a CUDA graph, so a scheduler's
      new lr needs no new capture) and updates every weight in one pass: W -= lr * g with the
      product in double, the buffer `momentum * buf + g` (buf starts at zero, so its first
      step is torch's `buf = g`, as `sgd_update`'s), weight decay and Nesterov as torch.optim.
      Equal to `sgd_update`'s `addcmul` (float) within one fp32 rounding per step, the
      rounding torch.optim.SGD(fused=True) has against its foreach path. `_foreach_mul_`
      of the gradients by the lr tensor then `_foreach_sub_` would be two passes more over
      the gradients (slower than one `addcmul` per weight on a 0.85e9-parameter model)."""
    if not weights:
        return True
    if isinstance(lr, float):
        if momentum or weight_decay:
            return False
        torch._foreach_add_(weights, grads, alpha=-lr)
        return True
    if lr.device.type != "cuda" or lr.dtype != torch.float32 or \
            not fusable_lists(weights, grads, bufs if momentum else []):
        return False
    torch._fused_sgd_(weights, grads, bufs if momentum else [], weight_decay=weight_decay,
                      momentum=momentum, lr=lr, dampening=0.0, nesterov=nesterov,
                      maximize=False, is_first_step=False)
    return True
