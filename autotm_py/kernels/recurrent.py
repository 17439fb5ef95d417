"""Torch kernels of ONNX's recurrent layers, `LSTM` and `GRU`, and of their gradients.

The forward computes exactly ONNX's semantics from ONNX's weight layout (W (D, G*H, I),
R (D, G*H, H), B (D, 2*G*H) = [Wb, Rb], gate order LSTM i o f c, GRU z r h):

- LSTM, and GRU with `linear_before_reset = 1` (what torch exports), run torch's own
  recurrent kernel (`torch._VF.lstm` / `torch._VF.gru`, cuDNN on CUDA) on the weights
  reordered into torch's gate order (LSTM i f g o, GRU r z n): copies of rows, so the result
  is the one `nn.LSTM`/`nn.GRU` computes with those weights. A `reverse` direction runs on
  the time-flipped sequence; `bidirectional` is torch's bidirectional layer.
- GRU with `linear_before_reset = 0` (ONNX's default, which torch has no kernel for) runs an
  explicit loop over the steps: one product for every step's input gates, then per step
  `h~ = tanh(x Wh^T + (r * h) Rh^T + Rbh + Wbh)`.

`layout = 1` operands (batch first) are transposed to ONNX's layout 0 and back.

The gradient kernels (`LSTMGrad`, `GRUGrad`, `ir/rules/recurrent.py`) recompute the forward of
the whole sequence from the saved inputs under `torch.enable_grad()` and call
`torch.autograd.grad` with the incoming gradients of Y, Y_h (and Y_c): the backward torch
itself runs for the layer (cuDNN's on CUDA), at the price of a second forward. Their inputs
are the forward's inputs (X W R B initial_h [initial_c]) followed by the present output
gradients (`grad_mask`); they output the gradients that `output_mask` asks for. With
`batch_chunks = k` (`ir.conv_split`, a split for a budget) a one-directional layer and its
gradient kernel run over k segments of the sequence in turn (below), a bidirectional one over k
slices of the batch, so their temporaries (the gradient's recomputed forward's tape) are 1/k
as large.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from autotm_py.ir.conv_split import CHUNKS_ATTR, in_sequence_chunks
from autotm_py.ir.graph import Kernel
from autotm_py.kernels.util import over_batch_chunks, register

Tensors = Sequence[torch.Tensor]
# ONNX gate chunks in torch's order: LSTM i o f c -> i f g(c) o, GRU z r h -> r z n(h)
TORCH_ORDER = {"LSTM": (0, 2, 3, 1), "GRU": (1, 0, 2)}


def _reorder(t: torch.Tensor, op: str) -> torch.Tensor:
    chunks = t.chunk(len(TORCH_ORDER[op]), 0)
    return torch.cat([chunks[i] for i in TORCH_ORDER[op]])


def _torch_params(op: str, w: torch.Tensor, r: torch.Tensor, b: torch.Tensor
                  ) -> list[torch.Tensor]:
    """torch's flat parameter list (w_ih, w_hh, b_ih, b_hh per direction)."""
    params = []
    for d in range(w.shape[0]):
        wb, rb = b[d].chunk(2)
        params += [_reorder(w[d], op), _reorder(r[d], op), _reorder(wb, op), _reorder(rb, op)]
    return params


def _layout0(t: torch.Tensor, layout: int) -> torch.Tensor:
    """X (B, T, I) or a state (B, D, H) of layout 1 as layout 0's (T, B, I) / (D, B, H)."""
    return t.transpose(0, 1).contiguous() if layout else t


def _vf_run(op: str, x: torch.Tensor, states: list[torch.Tensor], params: list[torch.Tensor],
            bidirectional: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """torch's recurrent kernel, one layer: (y (T, B, D*H), final states (D, B, H)). In
    training mode (cuDNN's reserve for the backward) only where autograd records it."""
    train = any(t.requires_grad for t in (x, *states, *params))
    if op == "LSTM":
        y, h, c = torch._VF.lstm(x, tuple(states), params, True, 1, 0.0, train, bidirectional,
                                 False)
        return y, [h, c]
    y, h = torch._VF.gru(x, states[0], params, True, 1, 0.0, train, bidirectional, False)
    return y, [h]


def _gru_loop(x: torch.Tensor, h: torch.Tensor, w: torch.Tensor, r: torch.Tensor,
              b: torch.Tensor, reverse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """One direction of ONNX's GRU with linear_before_reset = 0: (Y (T, B, H), final h)."""
    hidden = r.shape[1]
    wb, rb = b.chunk(2)
    xw = F.linear(x, w, wb)  # every step's input gates in one product
    rzr, rbzr = r[: 2 * hidden], rb[: 2 * hidden]
    rh, rbh = r[2 * hidden:], rb[2 * hidden:]
    steps = range(x.shape[0] - 1, -1, -1) if reverse else range(x.shape[0])
    ys: list[torch.Tensor] = []
    for t in steps:
        xz, xr, xh = xw[t].chunk(3, -1)
        hz, hr = F.linear(h, rzr, rbzr).chunk(2, -1)
        z, rg = torch.sigmoid(xz + hz), torch.sigmoid(xr + hr)
        cand = torch.tanh(xh + F.linear(rg * h, rh, rbh))
        h = (1 - z) * cand + z * h
        ys.append(h)
    if reverse:
        ys.reverse()
    return torch.stack(ys), h


def recurrent_forward(op: str, kernel: Kernel, args: Tensors) -> list[torch.Tensor]:
    """Y, Y_h[, Y_c] of ONNX's `op` (LSTM or GRU) with `kernel`'s attributes on the canonical
    slots X W R B initial_h [initial_c], in the kernel's layout."""
    layout = int(kernel.attr("layout", 0))
    direction = str(kernel.attr("direction", "forward"))
    x, w, r, b = _layout0(args[0], layout), args[1], args[2], args[3]
    states = [_layout0(s, layout) for s in args[4:]]
    if op == "GRU" and not int(kernel.attr("linear_before_reset", 0)):
        parts = [_gru_loop(x, states[0][d], w[d], r[d], b[d],
                           direction == "reverse" or d == 1) for d in range(w.shape[0])]
        y = torch.stack([p[0] for p in parts], 1)  # (T, D, B, H)
        finals = [torch.stack([p[1] for p in parts])]
    else:
        params = _torch_params(op, w, r, b)
        flip = direction == "reverse"
        seq, finals = _vf_run(op, x.flip(0) if flip else x, states, params,
                              direction == "bidirectional")
        seq = seq.flip(0) if flip else seq
        y = seq.view(seq.shape[0], seq.shape[1], w.shape[0], -1).transpose(1, 2)
    if layout:
        return [y.permute(2, 0, 1, 3), *(s.transpose(0, 1) for s in finals)]
    return [y, *finals]


@register("LSTM", "GRU")
def recurrent(kernel: Kernel, args: Tensors) -> list[torch.Tensor]:
    # Always in grad mode: torch's CPU kernel (oneDNN) takes another path, with other
    # roundings, when grad mode is off, so the reference runner (no_grad), an executor, the
    # gradient kernel's recomputation and nn.LSTM in training would each see other values.
    # Nothing is recorded unless an argument requires grad.
    with torch.enable_grad():
        if _sequence_chunks(kernel) > 1:
            return _over_segments(kernel.op_type, kernel, args)[0]  # type: ignore[return-value]
        return over_batch_chunks(kernel, args, *_batch_axes(kernel),
                                 lambda part: recurrent_forward(kernel.op_type, kernel, part))


# ---- chunks of the sequence -------------------------------------------------------------
# A one-directional layer in k chunks runs k segments of its sequence in turn, each from the
# last one's final states: the same steps at the whole batch (on a GPU a recurrence's time is
# its steps' latency, so k slices of the batch would cost about k times the whole), its input
# gates' temporaries 1/k. Its gradient kernel runs that forward once without a tape for the
# states at the segments' boundaries, then from the last segment back to the first
# recomputes one segment with autograd and back-propagates it, handing its initial states'
# gradients to the segment before: a tape of 1/k for one forward more.
def _sequence_chunks(kernel: Kernel) -> int:
    """The segments a recurrent kernel runs its sequence in (1: whole, or in batch chunks);
    at most its steps (`ir.conv_split.most_chunks` bounds the count)."""
    return int(kernel.attr(CHUNKS_ATTR, 1)) if in_sequence_chunks(kernel) else 1


def _segments(kernel: Kernel, x: torch.Tensor) -> tuple[list[torch.Tensor], list[int]]:
    """X's segments (along its time axis, the layout's) and the step each starts at."""
    axis = int(kernel.attr("layout", 0))
    pieces = list(x.tensor_split(_sequence_chunks(kernel), axis))
    starts = [0]
    for piece in pieces[:-1]:
        starts.append(starts[-1] + piece.shape[axis])
    return pieces, starts


def _segment_order(kernel: Kernel, count: int) -> list[int]:
    """The segments in the order the recurrence visits them (a reverse layer's from the end)."""
    order = list(range(count))
    return order[::-1] if kernel.attr("direction", "forward") == "reverse" else order


def _over_segments(op: str, kernel: Kernel, args: Tensors, whole_y: bool = True
                   ) -> tuple[list[torch.Tensor | None], dict[int, list[torch.Tensor]]]:
    """Y, Y_h[, Y_c] of the layer over its sequence's segments in turn (Y written into one
    tensor of the whole sequence; None unless `whole_y`: a gradient kernel wants the states
    only), and the states each segment starts from."""
    axis = int(kernel.attr("layout", 0))  # time: X (T, B, I) / Y (T, D, B, H), or batch first
    xs, starts = _segments(kernel, args[0])
    states, entering, y = list(args[4:]), {}, None
    for i in _segment_order(kernel, len(xs)):
        entering[i] = states
        part, *states = recurrent_forward(op, kernel, [xs[i], *args[1:4], *states])
        if not whole_y:
            continue
        if y is None:
            shape = list(part.shape)
            shape[axis] = args[0].shape[axis]
            y = part.new_empty(shape)
        y.narrow(axis, starts[i], part.shape[axis]).copy_(part)
    return [y, *states], entering  # type: ignore[list-item]


def _segments_backward(op: str, kernel: Kernel, args: Tensors) -> list[torch.Tensor]:
    """`recompute_grad` of a layer in sequence chunks: one segment's tape at a time."""
    grad_mask = [int(m) for m in kernel.attr("grad_mask")]
    out_mask = [bool(int(m)) for m in kernel.attr("output_mask")]
    inputs, dys = list(args[:len(out_mask)]), list(args[len(out_mask):])
    given = dict(zip([i for i, m in enumerate(grad_mask) if m], dys, strict=True))
    _, entering = _over_segments(op, kernel, inputs, whole_y=False)  # no grad: no tape
    xs, starts = _segments(kernel, inputs[0])
    dy = _segments(kernel, given[0])[0] if 0 in given else None  # Y's time axis is X's
    d_states = [given.get(1 + j) for j in range(len(inputs) - 4)]  # the last segment's
    whole: list[torch.Tensor | None] = [None] * len(inputs)
    order = _segment_order(kernel, len(xs))
    for i in reversed(order):
        first = i == order[0]
        needs = [out_mask[0], *out_mask[1:4], *((m if first else True) for m in out_mask[4:])]
        leaves = [a.detach().requires_grad_(n) for a, n in
                  zip([xs[i], *inputs[1:4], *entering[i]], needs, strict=True)]
        outs = recurrent_forward(op, kernel, leaves)
        pairs = [(o, g) for o, g in zip(outs, [None if dy is None else dy[i], *d_states],
                                        strict=True) if g is not None]
        wanted = [j for j, n in enumerate(needs) if n]
        grads = torch.autograd.grad([o for o, _ in pairs], [leaves[j] for j in wanted],
                                    [g for _, g in pairs], allow_unused=True) if pairs else \
            [None] * len(wanted)
        found = dict(zip(wanted, grads, strict=True))
        d_states = [found.get(4 + j) for j in range(len(inputs) - 4)]
        _gather(whole, found, inputs[0], starts[i], int(kernel.attr("layout", 0)), first)
    return [g if g is not None else torch.zeros_like(a)
            for g, a, m in zip(whole, inputs, out_mask, strict=True) if m]


def _gather(whole: list[torch.Tensor | None], found: dict[int, torch.Tensor | None],
            x: torch.Tensor, start: int, axis: int, first: bool) -> None:
    """Add a segment's gradients into the whole kernel's: X's at the segment's steps (from
    `start` along `axis` of the whole `x`), the weights' summed, the initial states' from the
    first segment the recurrence visits."""
    dx = found.get(0)
    if dx is not None:
        if whole[0] is None:
            whole[0] = torch.zeros_like(x)
        whole[0].narrow(axis, start, dx.shape[axis]).copy_(dx)
    for j in range(1, 4):
        g = found.get(j)
        if g is not None:
            whole[j] = g if whole[j] is None else whole[j].add_(g)  # type: ignore[union-attr]
    if first:
        for j in range(4, len(whole)):
            whole[j] = found.get(j)


def recompute_grad(kernel: Kernel, args: Tensors,
                   forward: Callable[[Tensors], list[torch.Tensor]]) -> list[torch.Tensor]:
    """The forward of the sequence again, with autograd, then its gradients: the inputs the
    forward reads, then the present output gradients (`grad_mask`); the gradients of the
    inputs `output_mask` names, in slot order."""
    grad_mask = tuple(int(m) for m in kernel.attr("grad_mask"))
    out_mask = tuple(int(m) for m in kernel.attr("output_mask"))
    n_in = len(out_mask)
    inputs, dys = args[:n_in], args[n_in:]
    with torch.enable_grad():
        leaves = [a.detach().requires_grad_(bool(m)) for a, m in zip(inputs, out_mask,
                                                                         strict=True)]
        outs = forward(leaves)
        chosen = [o for o, m in zip(outs, grad_mask, strict=True) if m]
        wanted = [leaf for leaf, m in zip(leaves, out_mask, strict=True) if m]
        grads = torch.autograd.grad(chosen, wanted, list(dys), allow_unused=True)
    return [g if g is not None else torch.zeros_like(leaf)
            for g, leaf in zip(grads, wanted, strict=True)]


def _batch_axes(kernel: Kernel) -> tuple[list[int | None], list[int | None]]:
    """The batch axis of each input and each output of a recurrent kernel (None: not
    batched): X (T, B, I), states (D, B, H) and Y or dY (T, D, B, H) in layout 0, batch first
    in layout 1; W, R and B and their gradients are shared by every sequence."""
    sequence, state, y = (0, 0, 0) if int(kernel.attr("layout", 0)) else (1, 1, 2)
    if not kernel.op_type.endswith("Grad"):  # X W R B h [c] -> Y Y_h [Y_c]
        return ([sequence, None, None, None] + [state] * (len(kernel.inputs) - 4),
                [y] + [state] * (2 if kernel.op_type == "LSTM" else 1))
    forward = [sequence, None, None, None] + [state] * (len(kernel.attr("output_mask")) - 4)
    present = [i for i, m in enumerate(kernel.attr("grad_mask")) if int(m)]  # Y, Y_h, Y_c
    wanted = [forward[i] for i, m in enumerate(kernel.attr("output_mask")) if int(m)]
    return forward + [y if which == 0 else state for which in present], wanted


@register("LSTMGrad", "GRUGrad")
def recurrent_backward(kernel: Kernel, args: Tensors) -> list[torch.Tensor]:
    op = kernel.op_type.removesuffix("Grad")

    def grad(part: Tensors) -> list[torch.Tensor]:
        return recompute_grad(kernel, part, lambda leaves: recurrent_forward(op, kernel, leaves))

    if _sequence_chunks(kernel) > 1:
        with torch.enable_grad():
            return _segments_backward(op, kernel, args)
    return over_batch_chunks(kernel, args, *_batch_axes(kernel), grad)
