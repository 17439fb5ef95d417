"""Training rules of reductions and data-movement ops (reshape, transpose, concat, split,
slice, gather, expand, tile, pad, resize, trilu). None of them saves an activation except
Gather, whose backward reads the indices.
"""

from __future__ import annotations

from autotm_py.ir.rules.base import KernelDraft, Rule, Tape, grad_name
from autotm_py.ir.rules.elementwise import sum_to
from autotm_py.ir.rules.geometry import full_pads, normalize_axes, resize_plan, slice_ranges

Grads = list[int | None]


def _one(tape: Tape, kernel: KernelDraft, op: str, inputs: list[int], /,
         **attrs: object) -> Grads:
    """One backward kernel that produces the gradient of input 0 (shape in `shape`)."""
    x = kernel.inputs[0]
    g = tape.new_grad(x)
    tape.emit(op, inputs, [g], grad_name(kernel, "grad"), shape=tape.shape(x), **attrs)
    return [g] + [None] * (len(kernel.inputs) - 1)


def _dy(dys: Grads) -> int:
    dy = dys[0]
    assert dy is not None
    return dy


def reduce_backward(tape: Tape, k: KernelDraft, dys: Grads, needs: list[bool]) -> Grads:
    dy = _dy(dys)
    axes = k.attr("axes")
    rank = len(tape.shape(k.inputs[0]))
    if not axes and int(k.attr("noop_with_empty_axes", 0)):
        return [dy]
    op = "ReduceSumGrad" if k.op_type == "ReduceSum" else "ReduceMeanGrad"
    return _one(tape, k, op, [dy], axes=normalize_axes(axes or None, rank),
                keepdims=int(k.attr("keepdims", 1)))


def reshape_backward(tape: Tape, k: KernelDraft, dys: Grads, needs: list[bool]) -> Grads:
    return _one(tape, k, "ReshapeGrad", [_dy(dys)])


def transpose_backward(tape: Tape, k: KernelDraft, dys: Grads, needs: list[bool]) -> Grads:
    rank = len(tape.shape(k.inputs[0]))
    perm = [int(p) for p in (k.attr("perm") or range(rank - 1, -1, -1))]
    inverse = [0] * rank
    for i, p in enumerate(perm):
        inverse[p] = i
    return _one(tape, k, "TransposeGrad", [_dy(dys)], perm=tuple(inverse))


def concat_backward(tape: Tape, k: KernelDraft, dys: Grads, needs: list[bool]) -> Grads:
    dy = _dy(dys)
    rank = len(tape.shape(dy))
    axis = int(k.attr("axis")) % rank
    grads: Grads = [tape.new_grad(x) if needs[i] else None for i, x in enumerate(k.inputs)]
    tape.emit("ConcatGrad", [dy], [g for g in grads if g is not None], grad_name(k, "grad"),
              axis=axis, sizes=tuple(tape.shape(x)[axis] for x in k.inputs),
              keep=tuple(i for i, g in enumerate(grads) if g is not None))
    return grads


def split_backward(tape: Tape, k: KernelDraft, dys: Grads, needs: list[bool]) -> Grads:
    x = k.inputs[0]
    axis = int(k.attr("axis", 0)) % len(tape.shape(x))
    present = tuple(i for i, d in enumerate(dys) if d is not None)
    return _one(tape, k, "SplitGrad", [d for d in dys if d is not None], axis=axis,
                sizes=tuple(tape.shape(y)[axis] for y in k.outputs), present=present)


def slice_backward(tape: Tape, k: KernelDraft, dys: Grads, needs: list[bool]) -> Grads:
    x_shape = tape.shape(k.inputs[0])
    ranges = slice_ranges(x_shape, k.attr("starts"), k.attr("ends"), k.attr("axes"),
                          k.attr("steps"))
    return _one(tape, k, "SliceGrad", [_dy(dys)], axes=tuple(r[0] for r in ranges),
                starts=tuple(r[1] for r in ranges), ends=tuple(r[2] for r in ranges),
                steps=tuple(r[3] for r in ranges))


def gather_backward(tape: Tape, k: KernelDraft, dys: Grads, needs: list[bool]) -> Grads:
    rank = len(tape.shape(k.inputs[0]))
    return _one(tape, k, "GatherGrad", [_dy(dys), k.inputs[1]],
                axis=int(k.attr("axis", 0)) % rank)


def expand_backward(tape: Tape, k: KernelDraft, dys: Grads, needs: list[bool]) -> Grads:
    return [sum_to(tape, k, _dy(dys), k.inputs[0])]


def tile_backward(tape: Tape, k: KernelDraft, dys: Grads, needs: list[bool]) -> Grads:
    return _one(tape, k, "TileGrad", [_dy(dys)],
                repeats=tuple(int(r) for r in k.attr("repeats")))


def pad_backward(tape: Tape, k: KernelDraft, dys: Grads, needs: list[bool]) -> Grads:
    rank = len(tape.shape(k.inputs[0]))
    pads = full_pads(rank, k.attr("pads"), k.attr("axes"))
    return _one(tape, k, "PadGrad", [_dy(dys)], pads=pads,
                mode=str(k.attr("mode", "constant")))


RESIZE_ATTRS = {"mode": "nearest", "coordinate_transformation_mode": "half_pixel",
                "nearest_mode": "round_prefer_floor", "cubic_coeff_a": -0.75,
                "exclude_outside": 0, "roi": None}


def resize_backward(tape: Tape, k: KernelDraft, dys: Grads, needs: list[bool]) -> Grads:
    dy = _dy(dys)
    _, scales = resize_plan(tape.shape(k.inputs[0]), k.attrs)
    attrs = {name: k.attr(name, default) for name, default in RESIZE_ATTRS.items()}
    return _one(tape, k, "ResizeGrad", [dy], scales=scales, **attrs)


def trilu_backward(tape: Tape, k: KernelDraft, dys: Grads, needs: list[bool]) -> Grads:
    return _one(tape, k, "TriluGrad", [_dy(dys)], upper=int(k.attr("upper", 1)),
                k=int(k.attr("k", 0)))


RULES: dict[str, Rule] = {
    "ReduceMean": Rule(reduce_backward),
    "ReduceSum": Rule(reduce_backward),
    **{op: Rule(reshape_backward) for op in ("Reshape", "Flatten", "Squeeze", "Unsqueeze")},
    "Transpose": Rule(transpose_backward),
    "Concat": Rule(concat_backward),
    "Split": Rule(split_backward, outputs=None),
    "Slice": Rule(slice_backward),
    "Gather": Rule(gather_backward, inputs=(0,)),
    "Expand": Rule(expand_backward),
    "Tile": Rule(tile_backward),
    "Pad": Rule(pad_backward),
    "Resize": Rule(resize_backward),
    "Trilu": Rule(trilu_backward),
}
