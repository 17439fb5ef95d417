"""Forward torch kernels of elementwise ops, reductions and data movement (ONNX semantics)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from autotm_py.ir.graph import Kernel
from autotm_py.ir.rules.geometry import broadcast_shape, full_pads, normalize_axes, slice_ranges
from autotm_py.kernels.util import Impl, pad_spec, register, torch_dtype, unsupported

Tensors = Sequence[torch.Tensor]


# ---- elementwise ------------------------------------------------------------------------
# Binary ops that are one torch function of both inputs (broadcasting as ONNX does).
BINARY = {"Add": torch.add, "Sub": torch.sub, "Mul": torch.mul, "Max": torch.maximum,
          "Min": torch.minimum}


def _binary(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Impl:
    def kernel(k: Kernel, args: Tensors) -> torch.Tensor:
        return fn(args[0], args[1])

    return kernel


for _op, _fn in BINARY.items():
    register(_op)(_binary(_fn))


@register("Div")
def div(k: Kernel, args: Tensors) -> torch.Tensor:
    a, b = args
    if a.dtype.is_floating_point:
        return torch.div(a, b)
    return torch.div(a, b, rounding_mode="trunc")  # ONNX integer division truncates


@register("Pow")
def pow_(k: Kernel, args: Tensors) -> torch.Tensor:
    return torch.pow(args[0], args[1]).to(args[0].dtype)


@register("Where")
def where(k: Kernel, args: Tensors) -> torch.Tensor:
    return torch.where(args[0], args[1], args[2])


@register("Sum", "GradAccumulate")
def sum_(k: Kernel, args: Tensors) -> torch.Tensor:
    return functools.reduce(torch.add, args)


UNARY = {
    "Relu": torch.relu, "Sigmoid": torch.sigmoid, "Tanh": torch.tanh, "Erf": torch.erf,
    "Sqrt": torch.sqrt, "Reciprocal": torch.reciprocal, "Neg": torch.neg, "Exp": torch.exp,
    "Log": torch.log, "Abs": torch.abs,
}


@register(*UNARY)
def unary(k: Kernel, args: Tensors) -> torch.Tensor:
    return UNARY[k.op_type](args[0])


@register("LeakyRelu")
def leaky_relu(k: Kernel, args: Tensors) -> torch.Tensor:
    return F.leaky_relu(args[0], float(k.attr("alpha", 0.01)))


@register("Gelu")
def gelu(k: Kernel, args: Tensors) -> torch.Tensor:
    return F.gelu(args[0], approximate=str(k.attr("approximate", "none")))


@register("Identity")
def identity(k: Kernel, args: Tensors) -> torch.Tensor:
    return args[0]


@register("Cast", "CastGrad")
def cast(k: Kernel, args: Tensors) -> torch.Tensor:
    return args[0].to(torch_dtype(k.attr("to")))


@register("Clip")
def clip(k: Kernel, args: Tensors) -> torch.Tensor:
    return torch.clamp(args[0], k.attr("min"), k.attr("max"))


@register("Dropout")
def dropout(k: Kernel, args: Tensors) -> tuple[torch.Tensor, ...]:
    """Training mode: keep each element with probability 1 - ratio. The mask is drawn on the
    host by a generator seeded with ONNX's `seed` attribute if given, else the kernel id, so
    every run, every plan and every device of a graph draws the same mask (the same one at
    every iteration). It is drawn once and kept (`_dropout_mask`): on a GPU each call copies
    it from pinned memory, which a CUDA graph can capture (a seeded device generator cannot)."""
    x = args[0]
    ratio = float(k.attr("ratio", 0.5))
    if not k.attr("training_mode", 0) or ratio == 0.0:
        mask = torch.ones_like(x, dtype=torch.bool)
        return (x, mask)[: len(k.outputs)]
    seed = k.attr("seed")
    mask = _dropout_mask(int(k.id if seed is None else seed), tuple(x.shape), ratio, x.device)
    y = x * mask * (1.0 / (1.0 - ratio))
    return (y, mask)[: len(k.outputs)]


_DROPOUT_MASKS: dict[tuple[int, tuple[int, ...], float, bool], torch.Tensor] = {}
DROPOUT_MASKS_KEPT = 64


def _dropout_mask(seed: int, shape: tuple[int, ...], ratio: float,
                  device: torch.device) -> torch.Tensor:
    """A fresh tensor on `device` holding the mask of `seed` (drawn on the host once: pinned
    where it is copied to a GPU, so the copy does not synchronize)."""
    pin = device.type == "cuda"
    key = (seed, shape, ratio, pin)
    mask = _DROPOUT_MASKS.get(key)
    if mask is None:
        mask = torch.rand(shape, generator=torch.Generator().manual_seed(seed)) >= ratio
        if pin:
            mask = mask.pin_memory()
        if len(_DROPOUT_MASKS) >= DROPOUT_MASKS_KEPT:
            _DROPOUT_MASKS.pop(next(iter(_DROPOUT_MASKS)))
        _DROPOUT_MASKS[key] = mask
    return mask.to(device, non_blocking=True) if device.type != "cpu" else mask.clone()


# ---- reductions -------------------------------------------------------------------------
def reduce_axes(k: Kernel, rank: int) -> tuple[int, ...] | None:
    """The axes to reduce, or None for ONNX's no-op on empty axes."""
    axes = k.attr("axes")
    if not axes:
        return None if int(k.attr("noop_with_empty_axes", 0)) else tuple(range(rank))
    return normalize_axes(axes, rank)


@register("ReduceSum", "ReduceMean")
def reduce(k: Kernel, args: Tensors) -> torch.Tensor:
    x = args[0]
    axes = reduce_axes(k, x.dim())
    if axes is None:
        return x
    keep = bool(k.attr("keepdims", 1))
    fn = torch.sum if k.op_type == "ReduceSum" else torch.mean
    return fn(x, dim=axes, keepdim=keep) if axes else x


# ---- shape and data movement ------------------------------------------------------------
@register("Reshape")
def reshape(k: Kernel, args: Tensors) -> torch.Tensor:
    x = args[0]
    allow_zero = int(k.attr("allowzero", 0))
    shape = [x.shape[i] if (int(s) == 0 and not allow_zero) else int(s)
             for i, s in enumerate(k.attr("shape"))]
    return x.reshape(shape)


@register("Flatten")
def flatten(k: Kernel, args: Tensors) -> torch.Tensor:
    x = args[0]
    axis = int(k.attr("axis", 1)) % (x.dim() + 1) if x.dim() else 0
    return x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))


@register("Squeeze")
def squeeze(k: Kernel, args: Tensors) -> torch.Tensor:
    x = args[0]
    axes = k.attr("axes")
    if not axes:
        return x.squeeze()
    return x.squeeze(normalize_axes(axes, x.dim()))


@register("Unsqueeze")
def unsqueeze(k: Kernel, args: Tensors) -> torch.Tensor:
    x = args[0]
    for axis in normalize_axes(k.attr("axes"), x.dim() + len(k.attr("axes"))):
        x = x.unsqueeze(axis)
    return x


@register("ReshapeGrad")
def reshape_grad(k: Kernel, args: Tensors) -> torch.Tensor:
    return args[0].reshape(k.attr("shape"))


@register("Transpose", "TransposeGrad")
def transpose(k: Kernel, args: Tensors) -> torch.Tensor:
    x = args[0]
    perm = k.attr("perm") or tuple(range(x.dim() - 1, -1, -1))
    return x.permute(perm)


@register("Concat")
def concat(k: Kernel, args: Tensors) -> torch.Tensor:
    return torch.cat(list(args), int(k.attr("axis")))


def split_sizes(k: Kernel, length: int) -> list[int]:
    """Split's sizes: `split`, else `num_outputs` chunks (the last may be smaller)."""
    if k.attr("split"):
        return [int(s) for s in k.attr("split")]
    parts = int(k.attr("num_outputs") or len(k.outputs))
    chunk = -(-length // parts)
    return [min(chunk, length - i * chunk) for i in range(parts)]


@register("Split")
def split(k: Kernel, args: Tensors) -> tuple[torch.Tensor, ...]:
    x = args[0]
    axis = int(k.attr("axis", 0))
    return tuple(torch.split(x, split_sizes(k, x.shape[axis]), axis))


def positive_slice(start: int, end: int, step: int) -> tuple[slice, bool]:
    """A step > 0 slice selecting the same elements, and whether their order is reversed."""
    if step > 0:
        return slice(start, end, step), False
    count = len(range(start, end, step))
    if count == 0:
        return slice(0, 0, 1), False
    low = start + (count - 1) * step
    return slice(low, start + 1, -step), True


def slice_index(rank: int, ranges: Sequence[tuple[int, int, int, int]]
                ) -> tuple[tuple[slice, ...], list[int]]:
    """Index tuple for the slice, and the axes to flip afterwards (negative steps)."""
    index = [slice(None)] * rank
    flips = []
    for axis, start, end, step in ranges:
        index[axis], flip = positive_slice(start, end, step)
        if flip:
            flips.append(axis)
    return tuple(index), flips


@register("Slice")
def slice_(k: Kernel, args: Tensors) -> torch.Tensor:
    x = args[0]
    ranges = slice_ranges(x.shape, k.attr("starts"), k.attr("ends"), k.attr("axes"),
                          k.attr("steps"))
    index, flips = slice_index(x.dim(), ranges)
    y = x[index]
    return y.flip(flips) if flips else y


@register("Gather")
def gather(k: Kernel, args: Tensors) -> torch.Tensor:
    data, idx = args
    axis = int(k.attr("axis", 0)) % data.dim()
    n = data.shape[axis]
    idx = torch.where(idx < 0, idx + n, idx).long()
    if axis == 0 and data.dim() == 2:
        return F.embedding(idx, data)
    picked = torch.index_select(data, axis, idx.reshape(-1))
    return picked.reshape(*data.shape[:axis], *idx.shape, *data.shape[axis + 1:])


@register("Expand")
def expand(k: Kernel, args: Tensors) -> torch.Tensor:
    x = args[0]
    return x.expand(broadcast_shape(x.shape, [int(s) for s in k.attr("shape")]))


@register("Tile")
def tile(k: Kernel, args: Tensors) -> torch.Tensor:
    return args[0].repeat([int(r) for r in k.attr("repeats")])


def pad_indices(size: int, before: int, after: int, mode: str, device: torch.device
                ) -> torch.Tensor:
    """Source index of every output position of one padded axis (reflect/edge/wrap)."""
    pos = torch.arange(-before, size + after, device=device)
    if mode == "edge":
        return pos.clamp(0, size - 1)
    if mode == "wrap":
        return pos % size
    period = 2 * (size - 1) if size > 1 else 1
    pos = pos.abs() % period
    return torch.where(pos >= size, period - pos, pos)


@register("Pad")
def pad(k: Kernel, args: Tensors) -> torch.Tensor:
    x = args[0]
    pads = full_pads(x.dim(), k.attr("pads"), k.attr("axes"))
    mode = str(k.attr("mode", "constant"))
    if mode == "constant":
        value = k.attr("constant_value")
        return F.pad(x, pad_spec(pads), value=0.0 if value is None else float(value))
    if mode not in ("reflect", "edge", "wrap"):
        raise unsupported(k, f"Pad mode {mode!r}")
    rank = x.dim()
    for axis in range(rank):
        before, after = pads[axis], pads[rank + axis]
        if before or after:
            idx = pad_indices(x.shape[axis], before, after, mode, x.device)
            x = torch.index_select(x, axis, idx)
    return x


@register("Trilu", "TriluGrad")
def trilu(k: Kernel, args: Tensors) -> torch.Tensor:
    x, diag = args[0], int(k.attr("k", 0))
    return torch.triu(x, diag) if int(k.attr("upper", 1)) else torch.tril(x, diag)


__all__ = ["pad_indices", "positive_slice", "reduce_axes", "slice_index",
           "split_sizes"]
