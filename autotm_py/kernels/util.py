"""Shared pieces of the torch kernels: the registry, dtype maps, and small tensor helpers.

A kernel implementation is `impl(kernel, args) -> Tensor | tuple[Tensor, ...]`, with `args`
in `kernel.inputs` order. Implementations never modify their arguments; they may return views
of them (reshape, transpose, slice, split, expand, identity), as torch does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from autotm_py.errors import UnsupportedOpError
from autotm_py.ir.graph import Kernel, Tensor

Impl = Callable[[Kernel, Sequence[torch.Tensor]], Any]
REGISTRY: dict[str, Impl] = {}

TORCH_DTYPES: dict[str, torch.dtype] = {
    "float64": torch.float64, "float32": torch.float32, "float16": torch.float16,
    "bfloat16": torch.bfloat16, "int64": torch.int64, "int32": torch.int32,
    "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool,
}
# ONNX TensorProto.DataType codes (Cast's `to` when the importer keeps the number)
ONNX_DTYPE_CODES: dict[int, str] = {
    1: "float32", 2: "uint8", 3: "int8", 5: "int16", 6: "int32", 7: "int64", 9: "bool",
    10: "float16", 11: "float64", 16: "bfloat16",
}


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors' bytes meet (both contiguous, on one device)."""
    if a.device != b.device or not a.numel() or not b.numel():
        return False
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.numel() * b.element_size() and b0 < a0 + a.numel() * a.element_size()


def register(*ops: str) -> Callable[[Impl], Impl]:
    def deco(fn: Impl) -> Impl:
        for op in ops:
            REGISTRY[op] = fn
        return fn

    return deco


def torch_dtype(name: Any) -> torch.dtype:
    """A dtype from our dtype names or an ONNX TensorProto code."""
    if isinstance(name, int):
        name = ONNX_DTYPE_CODES[name]
    return TORCH_DTYPES[str(name)]


def attrs(k: Kernel) -> dict[str, Any]:
    return dict(k.attrs)


def unsupported(k: Kernel, why: str) -> UnsupportedOpError:
    return UnsupportedOpError(k.op_type, domain=k.domain, node=k.name,
                              what=f"the torch kernels ({why})")


HALF_DTYPES = (torch.bfloat16, torch.float16)


def loss_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype our softmax cross-entropy computes and writes its loss in, for logits in
    `dtype`: float32 for bf16 and fp16 (autocast's losses run in fp32; the logits stay half
    and are upcast inside the kernel), else their own. The unchunked loss (`SoftmaxCrossEntropy`)
    and the chunked one (`LinearCrossEntropy`) share it."""
    return torch.float32 if dtype in HALF_DTYPES else dtype


def log_softmax_rows(logits: torch.Tensor, axis: int,
                     out: torch.Tensor | None = None) -> torch.Tensor:
    """log_softmax over `axis` in `loss_dtype` of the logits: half logits read as they are and
    upcast by torch (`log_softmax(x, dim, dtype=float32)`, what autocast's fp32 list calls for
    log_softmax), written into `out` when given."""
    acc = loss_dtype(logits.dtype)
    if out is None:
        return torch.log_softmax(logits, axis, dtype=acc)
    return torch.log_softmax(logits, axis, dtype=acc, out=out)


def softmax_grad_rows(probs: torch.Tensor, labels: torch.Tensor, scale: float | torch.Tensor,
                      out: torch.Tensor | None = None,
                      minus_one: torch.Tensor | None = None) -> torch.Tensor:
    """The logits' gradient (softmax - onehot(labels)) * scale of (rows, classes) softmax
    probabilities `probs` (overwritten), computed in their dtype (fp32 for half logits) and
    rounded once into `out` (the logits' dtype, bf16 under autocast) when given, else in place.
    `scale`: one float or a (rows, 1) column; `minus_one`: a (>= rows, 1) column of -1."""
    if minus_one is None:
        minus_one = torch.full((probs.shape[0], 1), -1.0, dtype=probs.dtype, device=probs.device)
    probs.scatter_add_(1, labels.unsqueeze(1), minus_one[: probs.shape[0]])
    return probs.mul_(scale) if out is None else torch.mul(probs, scale, out=out)


def sum_to(t: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """Sum over broadcast axes so the result has `shape` (the adjoint of broadcasting)."""
    shape = tuple(shape)
    return t if tuple(t.shape) == shape else t.sum_to_size(shape)


def pad_spec(pads: Sequence[int]) -> list[int]:
    """ONNX pads (begins, then ends, first axis first) as F.pad's (last axis first) list."""
    n = len(pads) // 2
    spec: list[int] = []
    for axis in range(n - 1, -1, -1):
        spec += [int(pads[axis]), int(pads[n + axis])]
    return spec


def pad_spatial(x: torch.Tensor, pads: Sequence[int], value: float = 0.0) -> torch.Tensor:
    """Pad (or crop, for negative pads) the trailing len(pads)//2 axes."""
    if not any(pads):
        return x
    return F.pad(x, pad_spec(pads), value=value)


def negate(pads: Sequence[int]) -> list[int]:
    return [-int(p) for p in pads]


def conv_padding(pads: Sequence[int]) -> tuple[list[int], Sequence[int] | None]:
    """(torch padding, explicit pads to apply first): torch pads symmetrically only."""
    n = len(pads) // 2
    begins, ends = list(pads[:n]), list(pads[n:])
    if begins == ends:
        return [int(p) for p in begins], None
    return [0] * n, pads


def expanded_like(ref: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """A stand-in tensor of `shape` whose values are never read (aten backward APIs take one
    only for its size), as torch.nn.grad does; it allocates one element."""
    return ref.new_empty(1).expand(tuple(shape))


# ---- storage layout (`ir.layout`) ----------------------------------------------------------
def memory_format(tensor: Tensor) -> torch.memory_format:
    """How the IR tensor's values are stored: channels-last or row-major."""
    return torch.channels_last if tensor.channels_last else torch.contiguous_format


def typed_view(region: torch.Tensor, tensor: Tensor) -> torch.Tensor:
    """`region` (bytes, exactly `tensor.nbytes`) seen as the IR tensor, in its layout: the
    slots, pinned buffers and static inputs that hold it."""
    flat = region.view(TORCH_DTYPES[tensor.dtype])
    if not tensor.channels_last:
        return flat.view(tensor.shape)
    n, c, h, w = tensor.shape
    return flat.view(n, h, w, c).permute(0, 3, 1, 2)


def in_layout(value: torch.Tensor, tensor: Tensor) -> torch.Tensor:
    """`value` stored the way the IR tensor is (a copy only where it is not)."""
    return value.contiguous(memory_format=memory_format(tensor))


def empty_like_tensor(tensor: Tensor, device: torch.device | str) -> torch.Tensor:
    return torch.empty(tensor.shape, dtype=TORCH_DTYPES[tensor.dtype], device=device,
                       memory_format=memory_format(tensor))


def over_batch_chunks(k: Kernel, args: Sequence[torch.Tensor],
                      in_axes: Sequence[int | None], out_axes: Sequence[int | None],
                      run: Callable[[list[torch.Tensor]], Sequence[torch.Tensor]]
                      ) -> list[torch.Tensor]:
    """`run` on the whole batch, or over kernel `k`'s `batch_chunks` slices of it one after the
    other (`ir.conv_split`): each input is sliced along its axis in `in_axes` (None: whole,
    e.g. a weight), each output with an axis in `out_axes` is the slices' written into one tensor of
    the whole batch (the first slice's dtype and layout), and one without (a weight's gradient)
    the slices' sum. Only one slice's temporaries and one slice's outputs are alive beside the
    whole outputs."""
    chunks = int(k.attr("batch_chunks", 1))
    if chunks <= 1:
        return list(run(list(args)))
    batch = next(a.shape[ax] for a, ax in zip(args, in_axes, strict=True) if ax is not None)
    whole: list[torch.Tensor | None] = [None] * len(out_axes)
    start = 0
    for part in range(chunks):
        piece = [a if ax is None else a.tensor_split(chunks, ax)[part]
                 for a, ax in zip(args, in_axes, strict=True)]
        values = run(piece)
        for j, (value, ax) in enumerate(zip(values, out_axes, strict=True)):
            if ax is None:
                whole[j] = value if whole[j] is None else whole[j].add_(value)  # type: ignore[union-attr]
                continue
            if whole[j] is None:
                shape = list(value.shape)
                shape[ax] = batch
                whole[j] = torch.empty(shape, dtype=value.dtype, device=value.device,
                                       memory_format=_format_of(value))
            whole[j].narrow(ax, start, value.shape[ax]).copy_(value)  # type: ignore[union-attr]
        start += next(p.shape[ax] for p, ax in zip(piece, in_axes, strict=True)
                      if ax is not None)
    return whole  # type: ignore[return-value]


def over_image_chunks(k: Kernel, args: Sequence[torch.Tensor],
                      one: Callable[[list[torch.Tensor]], torch.Tensor]) -> torch.Tensor:
    """`over_batch_chunks` of a kernel whose first input and one output are batched and whose
    other inputs (a weight, a bias) are whole for every slice: a convolution, its data
    gradient."""
    rest = [None] * (len(args) - 1)
    return over_batch_chunks(k, args, [0, *rest], [0], lambda part: [one(part)])[0]


def _format_of(value: torch.Tensor) -> torch.memory_format:
    """The memory format `value` is stored in (channels-last images keep it when joined)."""
    if value.dim() == 4 and value.is_contiguous(memory_format=torch.channels_last) and \
            not value.is_contiguous():
        return torch.channels_last
    return torch.contiguous_format
