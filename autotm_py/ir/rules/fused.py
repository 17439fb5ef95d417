"""Fused ops of ours that the frontend's fusion pass (`frontend/fuse.py`) emits, and their
training rules.

`ScaledDotProductAttention` (domain "autotm") replaces MatMul(Q, K^T) -> scale -> mask ->
Softmax(last axis) -> MatMul(., V):

    inputs   Q (..., L, E), K (..., S, E), V (..., S, Ev)[, mask]   (rank 3 or 4, same batch)
    outputs  O (..., L, Ev)[, logsumexp (..., L)]
    attrs    scale (float), is_causal (0/1)

    O = softmax(Q K^T * scale + mask + causal) V

`mask` (optional) is additive (float, the dtype of Q) or boolean (True = attend), either
broadcastable to (..., L, S); `is_causal` masks out key positions j > i (top-left aligned, as
`torch.nn.functional.scaled_dot_product_attention` does). With `layout` "blhe" (rank 4 only)
Q, K, V and O are (B, L, H, E) instead of (B, H, L, E): the pass absorbs the Transposes
(0, 2, 1, 3) that split the heads off and merge them back, the layout torch's fused kernels
keep their operands in, so no transposed copy is made; the mask and the logsumexp keep the
(B, H, L, ...) order of the scores. A forward graph's kernel has one
output; the training derivation adds the row-wise logsumexp of the masked, scaled scores
(float32, float64 for float64 inputs), which the backward reads instead of the (L, S) score
or probability matrix:

    ScaledDotProductAttentionGrad: dO, Q, K, V, O, logsumexp[, mask] -> dQ, dK, dV (masked)

Saved for the backward: Q, K, V, O, logsumexp and the mask, i.e. O(L * (E + Ev + 1)) per
head instead of the O(L * S) probabilities the unfused graph keeps. The mask gets no
gradient (the fusion pass only fuses masks that do not depend on a trainable weight).

GELU needs no new op: the pass emits ONNX `Gelu` (domain "", `approximate` "none" or
"tanh"), whose rule (`elementwise.UNARY`) saves only its input X.

`Linear` (domain "autotm") replaces MatMul(X, W) + Add(., B) with a 2-d W and a bias B along
the last axis (how exporters and our zoo write a Linear layer on (..., K) activations), and
MatMul(X, Transpose(W)) with or without the bias (a tied output embedding):

    inputs   X (..., K), W (K, N), or (N, K) with transB = 1[, B (N,) with any leading 1s]
    outputs  Y (..., N) = X op(W) + B                         (one addmm, as torch's Linear)
    attrs    transB (0/1)

    LinearGrad: dY, X, W -> dX, dW, dB (masked): two products and the bias's row sum

Saved for the backward: X and W, as the unfused MatMul's; the product X W before the bias is
no tensor any more.

`ConvRelu` (domain "autotm") replaces Conv(X, W[, B]) -> Relu whose convolution output only the
ReLU reads (the pattern of VGG-style networks, where no normalization sits between them):

    inputs   X, W[, B] as Conv's; attrs Conv's (dilations group kernel_shape pads strides)
    outputs  Y = relu(conv(X, W) + B)        (on CUDA one cuDNN call, bias and ReLU fused)

    backward: ReluGrad(dY, Y) -> dZ, then Conv's own rule on dZ (one ConvGrad, or its parts)

Saved for the backward: X, W and Y, as the unfused pair's; the convolution's output before the
ReLU is no tensor any more, and on the GPU the bias and the ReLU are no passes of their own.

`RMSNormalization` (domain "autotm"; ONNX opset 23's op of that name and attributes) replaces the
RMSNorm of Llama-style models, x / sqrt(mean(x^2 over the last axis) + epsilon) times an
optional weight, which exporters write as Pow, ReduceMean, Add, Sqrt, Div (or Reciprocal) and
two Muls:

    inputs   X (..., D)[, Scale (D,)]; attrs axis (non-negative: the last axis), epsilon
    outputs  Y = X * rstd * Scale[, InvStdDev (..., 1) = rstd, float32 (float64 for float64)]

    RMSNormGrad: dY, X, InvStdDev[, Scale] -> dX, dScale (masked)

A forward graph's kernel has one output; the training derivation adds rstd, which the backward
reads with X (and the weight): the squares, their mean, the root and the normalized x before
the weight, all tensors the unfused backward kept, are no tensors any more.

`Silu` (domain "autotm") replaces Mul(X, Sigmoid(X)) (either operand order; SwiGLU's gate):

    inputs X; outputs Y = X * sigmoid(X);   SiluGrad: dY, X -> dX

Saved for the backward: X only (the unfused pair kept X and sigmoid(X)).

`RotaryEmbedding` (domain "autotm") replaces the rotary position embedding of Llama-style
models as transformers writes it (`apply_rotary_pos_emb`: q * cos + rotate_half(q) * sin,
rotate_half(x) = cat(-x[..., h:], x[..., :h]), h = D / 2), which exporters write as two Slices,
Neg, Concat, two Muls and an Add:

    inputs   X (..., D), COS, SIN (each of last axis D, broadcastable to X's shape; no
             gradient: constants or inputs that depend on no trainable weight)
    outputs  Y (X's shape):  Y[:h] = X[:h] COS[:h] - X[h:] SIN[:h]
                             Y[h:] = X[h:] COS[h:] + X[:h] SIN[h:]

    RotaryEmbeddingGrad: dY, COS, SIN -> dX   (the transposed rotation:
        dX[:h] = dY[:h] COS[:h] + dY[h:] SIN[h:],  dX[h:] = dY[h:] COS[h:] - dY[:h] SIN[:h])

Nothing is saved for the backward but COS and SIN (as for the unfused Muls); the halves, their
negation, the rotated copy and the two products are no tensors any more.
Attribute `layout` "blhe" (`frontend/fuse_heads.py`, rank 4): X, Y, dY and dX are (B, S, H, D)
while COS and SIN keep the shapes that broadcast into (B, H, S, D) (the kernels read them with
those two axes swapped).

`LinearCrossEntropy` (domain "autotm") is made by the training derivation, not the fusion pass:
with `--loss-chunks N` (N > 1) a softmax cross-entropy over the last axis of a `Linear`'s
output (a language model's vocabulary head) becomes one kernel that never holds the whole
logits, as fused linear cross-entropy kernels do (Liger-Kernel's, torchtune's chunked loss):

    inputs   X (..., K), W (K, V) or (V, K) with transB = 1[, B (V,)], labels (...) int
    outputs  loss (scalar, the mean over the rows), logsumexp (rows,) of each row's logits
    attrs    transB (0/1), chunks N

    LinearCrossEntropyGrad: X, W[, B], labels, logsumexp -> dX, dW, dB (masked)

Both work through the rows of X in N blocks of ceil(rows / N): a block's logits (rows / N x V)
are the kernel's workspace, computed again in the backward from X, W and the saved logsumexp.
The logits (rows x V), their log-probabilities and their gradient, three tensors of that size
at the unfused loss, are never tensors; the backward does one more matrix product (the
logits again) than the unfused pair. The loss is the same quantity, summed in another order
(not bitwise the unfused loss).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from autotm_py.ir.graph import DTYPE_SIZES, Role
from autotm_py.ir.rules.base import KernelDraft, Rule, Tape, grad_name
from autotm_py.ir.rules.nn import conv_backward

SDPA = "ScaledDotProductAttention"
BLHE = "blhe"  # the `layout` of Q, K, V, O as (batch, sequence, heads, head size)
SDPA_GRAD = "ScaledDotProductAttentionGrad"
LINEAR = "Linear"
LINEAR_GRAD = "LinearGrad"
LINEAR_CE = "LinearCrossEntropy"
LINEAR_CE_GRAD = "LinearCrossEntropyGrad"
CONV_RELU = "ConvRelu"
RMS_NORM = "RMSNormalization"
RMS_NORM_GRAD = "RMSNormGrad"
SILU = "Silu"
SILU_GRAD = "SiluGrad"
ROTARY = "RotaryEmbedding"
ROTARY_GRAD = "RotaryEmbeddingGrad"

# op type -> "inputs -> outputs: meaning" (the forward ops of ours a fused graph may contain)
FUSED_OPS: dict[str, str] = {
    SDPA: "Q, K, V[, mask] -> O[, logsumexp]: softmax(Q K^T * scale + mask) V "
          "(attrs scale, is_causal, layout)",
    LINEAR: "X, W[, B] -> Y = X W + B, or X W^T + B with transB = 1 (one addmm over the "
            "rows of X)",
    CONV_RELU: "X, W[, B] -> Y = relu(conv(X, W) + B) (Conv's attrs; one cuDNN call on CUDA)",
    RMS_NORM: "X[, Scale] -> Y[, InvStdDev]: X / sqrt(mean(X^2 over axes >= axis) + epsilon) "
              "* Scale (attrs axis, epsilon)",
    SILU: "X -> Y = X * sigmoid(X)",
    ROTARY: "X, COS, SIN -> Y = X * COS + rotate_half(X) * SIN, rotate_half(X) = "
            "cat(-X[..., h:], X[..., :h]), h = D / 2 (transformers' apply_rotary_pos_emb)",
}
FUSED_TRAINING_OPS: dict[str, str] = {
    SDPA_GRAD: "dO, Q, K, V, O, logsumexp[, mask] -> dQ, dK, dV (masked; scores recomputed "
               "blockwise from the saved logsumexp)",
    LINEAR_GRAD: "dY, X, W -> dX, dW, dB (masked; dB the row sum of dY)",
    LINEAR_CE: "X, W[, B], labels -> loss, logsumexp: mean softmax cross-entropy of X op(W) + B "
               "over its last axis, in `chunks` blocks of rows (--loss-chunks)",
    LINEAR_CE_GRAD: "X, W[, B], labels, logsumexp -> dX, dW, dB (masked; each block's logits "
                    "computed again)",
    RMS_NORM_GRAD: "dY, X, InvStdDev[, Scale] -> dX, dScale (masked; dScale summed over the "
                   "rows)",
    SILU_GRAD: "dY, X -> dX = dY * s (1 + X (1 - s)), s = sigmoid(X)",
    ROTARY_GRAD: "dY, COS, SIN -> dX = dY * COS + rotate_half^T(dY * SIN), rotate_half^T(Z) = "
                 "cat(Z[..., h:], -Z[..., :h]) (COS and SIN get no gradient)",
}

Grads = list[int | None]


def lse_dtype(dtype: str) -> str:
    """The logsumexp's dtype: what torch's attention kernels return (float32 unless float64)."""
    return "float64" if dtype == "float64" else "float32"


def sdpa_workspace(q_shape: Sequence[int], q_dtype: str, mask: tuple[tuple[int, ...], str]
                   | None, *, backward: bool) -> int:
    """Bytes an attention kernel allocates beyond its inputs and outputs (IR estimate).

    A boolean mask is turned into an additive one of the query's dtype (torch's fused kernels
    take additive masks only); the backward also computes the row sums D = rowsum(dO * O)
    (float32, one per query row). The kernels' blockwise buffers (a few tiles per thread or
    thread block) are not counted; profiles measured on a GPU record the real workspace."""
    total = 0
    if mask is not None and mask[1] == "bool":
        total += math.prod(mask[0]) * DTYPE_SIZES[q_dtype]
    if backward:
        total += math.prod(q_shape[:-1]) * DTYPE_SIZES[lse_dtype(q_dtype)]
    return total


def heads_first(shape: Sequence[int], layout: str | None) -> tuple[int, ...]:
    """An operand's shape as (..., L, E) with the heads before the rows, whatever `layout`."""
    shape = tuple(shape)
    return (shape[0], shape[2], shape[1], shape[3]) if layout == BLHE else shape


def sdpa_prepare(tape: Tape, k: KernelDraft) -> None:
    """Training: the forward kernel also outputs the logsumexp of each query row."""
    if len(k.outputs) < 2:
        q, o = k.inputs[0], k.outputs[0]
        rows = heads_first(tape.shape(q), k.attr("layout"))[:-1]
        k.outputs.append(tape.new_tensor(f"{tape.name(o)}::logsumexp", rows,
                                         lse_dtype(tape.dtype(q)), Role.ACTIVATION))


def sdpa_backward(tape: Tape, k: KernelDraft, dys: Grads, needs: list[bool]) -> Grads:
    dy = dys[0]
    assert dy is not None
    q, key, v = k.inputs[:3]
    mask = k.inputs[3:4]
    outs = [tape.new_grad(t) if needs[i] else None for i, t in enumerate((q, key, v))]
    tape.emit(SDPA_GRAD, [dy, q, key, v, k.outputs[0], k.outputs[1], *mask],
              [g for g in outs if g is not None], grad_name(k, "grad"),
              scale=float(k.attr("scale")), is_causal=int(k.attr("is_causal", 0)),
              output_mask=tuple(int(g is not None) for g in outs),
              **({"layout": BLHE} if k.attr("layout") == BLHE else {}))
    mask_spec = (tape.shape(mask[0]), tape.dtype(mask[0])) if mask else None
    tape.kernels[-1].workspace_bytes = sdpa_workspace(tape.shape(q), tape.dtype(q), mask_spec,
                                                      backward=True)
    return [*outs, *([None] * len(mask))]


def linear_backward(tape: Tape, k: KernelDraft, dys: Grads, needs: list[bool]) -> Grads:
    """One LinearGrad for every needed gradient (dX = dY op(W)^T, dW, dB = rows of dY summed),
    as the unfused MatMulGradA, MatMulGradB and SumToShape computed them."""
    dy = dys[0]
    assert dy is not None
    x, w = k.inputs[:2]
    outs = [tape.new_grad(t) if needs[i] else None for i, t in enumerate(k.inputs)]
    outs += [None] * (3 - len(outs))
    tape.emit(LINEAR_GRAD, [dy, x, w], [g for g in outs if g is not None], grad_name(k, "grad"),
              transB=int(k.attr("transB", 0)),
              output_mask=tuple(int(g is not None) for g in outs),
              bias_shape=tape.shape(k.inputs[2]) if len(k.inputs) > 2 else None)
    return outs[: len(k.inputs)]


def block_rows(rows: int, chunks: int) -> int:
    """Rows per block of a chunked loss: ceil(rows / chunks), at least 1."""
    return max(-(-rows // max(chunks, 1)), 1)


# On a GPU a chunked loss computes over its classes padded with zero weights to rows of this
# many bytes (kernels/fused.py's `_Head`): cuBLAS's aligned kernels need every dimension of a
# product aligned, which GPT-2's 50257 classes and BERT's 30522 in bf16 are not.
# Below PAD_MIN_CLASSES a product with the logits is too small for its kernel's alignment to
# matter, and the padded weight would be a large share of the loss's temporaries.
ALIGNED_ROW_BYTES = 128
PAD_MIN_CLASSES = 1024


def padded_classes(classes: int, itemsize: int) -> int:
    """The classes of a chunked loss padded to rows of `ALIGNED_ROW_BYTES` (`classes` itself
    below `PAD_MIN_CLASSES`)."""
    if classes < PAD_MIN_CLASSES:
        return classes
    per_row = max(1, ALIGNED_ROW_BYTES // itemsize)
    return -(-classes // per_row) * per_row


def linear_ce_workspace(x_shape: Sequence[int], classes: int, chunks: int, dtype: str) -> int:
    """Bytes of one block's logits, over the classes padded as a GPU pads them
    (`padded_classes`; at most 128 bytes a row more than the CPU's): the workspace of
    `LinearCrossEntropy` and its gradient."""
    rows = math.prod(x_shape[:-1])
    size = DTYPE_SIZES[dtype]
    return min(block_rows(rows, chunks), rows) * padded_classes(classes, size) * size


def linear_ce_padding(k: int, classes: int, dtype: str) -> int:
    """Bytes of a chunked loss's weight padded to `padded_classes` (K x padded, with its bias),
    where a GPU pads it (0 where the classes are already aligned): a temporary of the loss and
    of its gradient, which also sums the weight's gradient in one."""
    size = DTYPE_SIZES[dtype]
    padded = padded_classes(classes, size)
    return 0 if padded == classes else (k + 1) * padded * size


def linear_ce_classes(w_shape: Sequence[int], trans_b: int) -> int:
    """The number of classes (the logits' last axis) of a chunked loss with weight W."""
    return int(w_shape[0] if trans_b else w_shape[1])


def linear_ce_backward(tape: Tape, k: KernelDraft, dys: Grads, needs: list[bool]) -> Grads:
    """The loss is the seed (d loss = 1, as the unfused loss's): one LinearCrossEntropyGrad
    for the needed gradients of X, W and the bias; the labels get none."""
    weighted = k.inputs[:-1]  # X, W[, B]
    outs = [tape.new_grad(t) if needs[i] else None for i, t in enumerate(weighted)]
    outs += [None] * (3 - len(outs))
    trans = int(k.attr("transB", 0))
    tape.emit(LINEAR_CE_GRAD, [*k.inputs, k.outputs[1]], [g for g in outs if g is not None],
              grad_name(k, "grad"), transB=trans, chunks=int(k.attr("chunks", 1)),
              output_mask=tuple(int(g is not None) for g in outs))
    # one block's logits and the padded weight, as the forward's, and where the weight is
    # padded and its gradient needed, that gradient over the padded classes
    padding = linear_ce_padding(tape.shape(k.inputs[0])[-1],
                                linear_ce_classes(tape.shape(k.inputs[1]), trans),
                                tape.dtype(k.inputs[0])) if needs[1] else 0
    tape.kernels[-1].workspace_bytes = k.workspace_bytes + padding
    return [*outs[: len(weighted)], None]


def conv_relu_backward(tape: Tape, k: KernelDraft, dys: Grads, needs: list[bool]) -> Grads:
    """The ReLU's gradient from the saved output Y (as the unfused Relu's rule reads it), then
    the convolution's rule on it: the same kernels the unfused pair gets."""
    dy = dys[0]
    assert dy is not None
    y = k.outputs[0]
    dz = tape.new_tensor(f"grad::{tape.name(y)}::conv", tape.shape(y), tape.dtype(y),
                         Role.GRADIENT)
    tape.emit("ReluGrad", [dy, y], [dz], grad_name(k, "relu_grad"))
    return conv_backward(tape, k, [dz], needs)


def rms_stat_dtype(dtype: str) -> str:
    """InvStdDev's dtype: what aten's fused RMSNorm returns (float32 unless float64)."""
    return "float64" if dtype == "float64" else "float32"


def rms_norm_prepare(tape: Tape, k: KernelDraft) -> None:
    """Training: the forward kernel also outputs rstd per row (ONNX's InvStdDev), which the
    backward reads instead of recomputing the mean of squares."""
    if len(k.outputs) < 2:
        x, y = k.inputs[0], k.outputs[0]
        shape = tape.shape(x)
        axis = int(k.attr("axis", -1)) % len(shape)
        stat = shape[:axis] + (1,) * (len(shape) - axis)
        k.outputs.append(tape.new_tensor(f"{tape.name(y)}::invstd", stat,
                                         rms_stat_dtype(tape.dtype(x)), Role.ACTIVATION))


def rms_norm_backward(tape: Tape, k: KernelDraft, dys: Grads, needs: list[bool]) -> Grads:
    """One RMSNormGrad for dX and dScale, as LayerNormGrad does for layer norm."""
    dy = dys[0]
    assert dy is not None
    outs = [tape.new_grad(t) if needs[i] else None for i, t in enumerate(k.inputs)]
    outs += [None] * (2 - len(outs))
    axis = int(k.attr("axis", -1)) % len(tape.shape(k.inputs[0]))
    tape.emit(RMS_NORM_GRAD, [dy, k.inputs[0], k.outputs[1], *k.inputs[1:2]],
              [g for g in outs if g is not None], grad_name(k, "grad"), axis=axis,
              output_mask=tuple(int(g is not None) for g in outs))
    return outs[: len(k.inputs)]


def silu_backward(tape: Tape, k: KernelDraft, dys: Grads, needs: list[bool]) -> Grads:
    """From the saved input X, as GeluGrad (sigmoid(X) is recomputed, not kept)."""
    dy = dys[0]
    assert dy is not None
    g = tape.new_grad(k.inputs[0])
    tape.emit(SILU_GRAD, [dy, k.inputs[0]], [g], grad_name(k, "grad"))
    return [g]


def rotary_backward(tape: Tape, k: KernelDraft, dys: Grads, needs: list[bool]) -> Grads:
    """One RotaryEmbeddingGrad for dX from COS and SIN alone (the rotation is linear in X);
    COS and SIN are no differentiable slots (the fusion pass fuses only those that depend on
    no trainable weight)."""
    dy = dys[0]
    assert dy is not None
    if not needs[0]:
        return [None] * len(k.inputs)
    g = tape.new_grad(k.inputs[0])
    tape.emit(ROTARY_GRAD, [dy, *k.inputs[1:3]], [g], grad_name(k, "grad"),
              **({"layout": BLHE} if k.attr("layout") == BLHE else {}))
    return [g, None, None]


RULES: dict[str, Rule] = {
    SDPA: Rule(sdpa_backward, inputs=(0, 1, 2), prepare=sdpa_prepare),
    LINEAR: Rule(linear_backward),
    LINEAR_CE: Rule(linear_ce_backward),
    CONV_RELU: Rule(conv_relu_backward),
    RMS_NORM: Rule(rms_norm_backward, prepare=rms_norm_prepare),
    SILU: Rule(silu_backward),
    ROTARY: Rule(rotary_backward, inputs=(0,)),
}
