"""Training rules of the network ops: convolutions, matrix products, normalizations, softmax,
pooling and the softmax cross-entropy loss.

Saved tensors follow what cuDNN/PyTorch kernels read: a convolution whose input and filter
both need gradients gets one ConvGrad kernel (dY, X, W -> dX, dW[, dB]), as autograd runs one
`convolution_backward` for both; where only one is needed, ConvGradData reads dY and W and
ConvGradFilter reads dY and X. BatchNorm/LayerNorm backward read X, the scale and the batch
statistics that the forward kernel saves as extra outputs; MaxPoolGrad reads X (the argmax is
recomputed inside the kernel, as nGraph's MaxPoolBackprop does, instead of saving indices).
"""

from __future__ import annotations

from autotm_py.ir.graph import Role
from autotm_py.ir.rules.base import KernelDraft, Rule, Tape, grad_name
from autotm_py.ir.rules.elementwise import sum_to
from autotm_py.ir.rules.geometry import conv_transpose_window, window

Grads = list[int | None]


def _emit_grad(tape: Tape, k: KernelDraft, op: str, inputs: list[int], of: int,
               what: str, **attrs: object) -> int:
    g = tape.new_grad(of)
    tape.emit(op, inputs, [g], grad_name(k, what), shape=tape.shape(of), **attrs)
    return g


def _conv_like(tape: Tape, k: KernelDraft, dys: Grads, needs: list[bool], prefix: str,
               attrs: dict[str, object]) -> Grads:
    """`<prefix>Grad` (dY, X, W -> dX, dW and the bias gradient if needed) when the input and
    the filter both need gradients; else `<prefix>GradData` / `<prefix>GradFilter` and
    `ConvGradBias` for the one(s) needed."""
    dy = dys[0]
    assert dy is not None
    x, w = k.inputs[:2]
    bias = len(k.inputs) > 2 and needs[2]
    grads: Grads = [None] * len(k.inputs)
    if needs[0] and needs[1]:
        grads[0], grads[1] = tape.new_grad(x), tape.new_grad(w)
        if bias:
            grads[2] = tape.new_grad(k.inputs[2])
        tape.emit(f"{prefix}Grad", [dy, x, w], [g for g in grads if g is not None],
                  grad_name(k, "grad"), output_mask=(1, 1, int(bias)), **attrs)
        return grads
    if needs[0]:
        grads[0] = _emit_grad(tape, k, f"{prefix}GradData", [dy, w], x, "grad_data", **attrs)
    if needs[1]:
        grads[1] = _emit_grad(tape, k, f"{prefix}GradFilter", [dy, x], w, "grad_filter",
                              **attrs)
    if bias:
        grads[2] = _emit_grad(tape, k, "ConvGradBias", [dy], k.inputs[2], "grad_bias")
    return grads


def conv_backward(tape: Tape, k: KernelDraft, dys: Grads, needs: list[bool]) -> Grads:
    x_shape, w_shape = tape.shape(k.inputs[0]), tape.shape(k.inputs[1])
    geo = window(k.attrs, x_shape[2:], w_shape[2:])
    attrs = {"strides": geo.strides, "pads": geo.pads, "dilations": geo.dilations,
             "group": int(k.attr("group", 1))}
    return _conv_like(tape, k, dys, needs, "Conv", attrs)


def conv_transpose_backward(tape: Tape, k: KernelDraft, dys: Grads,
                            needs: list[bool]) -> Grads:
    x_shape, w_shape = tape.shape(k.inputs[0]), tape.shape(k.inputs[1])
    geo, out_pad = conv_transpose_window(k.attrs, x_shape[2:], w_shape[2:])
    attrs = {"strides": geo.strides, "pads": geo.pads, "dilations": geo.dilations,
             "group": int(k.attr("group", 1)), "output_padding": out_pad}
    return _conv_like(tape, k, dys, needs, "ConvTranspose", attrs)


def gemm_backward(tape: Tape, k: KernelDraft, dys: Grads, needs: list[bool]) -> Grads:
    dy = dys[0]
    assert dy is not None
    a, b = k.inputs[:2]
    attrs = {"alpha": float(k.attr("alpha", 1.0)), "transA": int(k.attr("transA", 0)),
             "transB": int(k.attr("transB", 0))}
    grads: Grads = [None] * len(k.inputs)
    if needs[0]:
        grads[0] = _emit_grad(tape, k, "GemmGradA", [dy, b], a, "grad_a", **attrs)
    if needs[1]:
        grads[1] = _emit_grad(tape, k, "GemmGradB", [dy, a], b, "grad_b", **attrs)
    if len(k.inputs) > 2 and needs[2]:
        grads[2] = sum_to(tape, k, dy, k.inputs[2], float(k.attr("beta", 1.0)), "grad_c")
    return grads


def matmul_backward(tape: Tape, k: KernelDraft, dys: Grads, needs: list[bool]) -> Grads:
    dy = dys[0]
    assert dy is not None
    a, b = k.inputs
    return [_emit_grad(tape, k, "MatMulGradA", [dy, b], a, "grad_a") if needs[0] else None,
            _emit_grad(tape, k, "MatMulGradB", [dy, a], b, "grad_b") if needs[1] else None]


def _stat_dtype(dtype: str) -> str:
    return "float64" if dtype == "float64" else "float32"


def batchnorm_prepare(tape: Tape, k: KernelDraft) -> None:
    """Training mode: batch statistics; outputs Y, running mean', var', saved mean, invstd."""
    x, _, _, mean, var = k.inputs
    y = k.outputs[0]
    k.attrs["training_mode"] = 1
    outs = [y]
    for slot, src in ((1, mean), (2, var)):
        if len(k.outputs) > slot:
            outs.append(k.outputs[slot])
            continue
        new = tape.new_tensor(f"{tape.name(src)}::next", tape.shape(src), tape.dtype(src),
                              tape.tensors[src].role)
        outs.append(new)
        if tape.tensors[src].role.persistent:
            tape.carried.append((src, new))
    channels = (tape.shape(x)[1],)
    stat = _stat_dtype(tape.dtype(x))
    for what in ("saved_mean", "saved_invstd"):
        outs.append(tape.new_tensor(f"{tape.name(y)}::{what}", channels, stat, Role.ACTIVATION))
    k.outputs = outs


def batchnorm_backward(tape: Tape, k: KernelDraft, dys: Grads, needs: list[bool]) -> Grads:
    dy = dys[0]
    assert dy is not None
    x, scale, bias = k.inputs[:3]
    outs = [tape.new_grad(t) if needs[i] else None for i, t in enumerate((x, scale, bias))]
    tape.emit("BatchNormGrad", [dy, x, scale, k.outputs[3], k.outputs[4]],
              [g for g in outs if g is not None], grad_name(k, "grad"),
              epsilon=float(k.attr("epsilon", 1e-5)),
              output_mask=tuple(int(g is not None) for g in outs))
    return [*outs, None, None]


def layernorm_prepare(tape: Tape, k: KernelDraft) -> None:
    """Outputs Y, Mean, InvStdDev (ONNX's optional outputs), saved for the backward."""
    x, y = k.inputs[0], k.outputs[0]
    shape = tape.shape(x)
    axis = int(k.attr("axis", -1)) % len(shape)
    stat_shape = shape[:axis] + (1,) * (len(shape) - axis)
    stat = _stat_dtype(tape.dtype(x))
    names = ("mean", "invstd")
    while len(k.outputs) < 3:
        what = names[len(k.outputs) - 1]
        k.outputs.append(tape.new_tensor(f"{tape.name(y)}::{what}", stat_shape, stat,
                                         Role.ACTIVATION))


def layernorm_backward(tape: Tape, k: KernelDraft, dys: Grads, needs: list[bool]) -> Grads:
    dy = dys[0]
    assert dy is not None
    outs = [tape.new_grad(t) if needs[i] else None for i, t in enumerate(k.inputs)]
    outs += [None] * (3 - len(outs))
    x, scale = k.inputs[:2]
    axis = int(k.attr("axis", -1)) % len(tape.shape(x))
    bias_shape = tape.shape(k.inputs[2]) if len(k.inputs) > 2 else None
    tape.emit("LayerNormGrad", [dy, x, scale, k.outputs[1], k.outputs[2]],
              [g for g in outs if g is not None], grad_name(k, "grad"), axis=axis,
              output_mask=tuple(int(g is not None) for g in outs), bias_shape=bias_shape)
    return outs[: len(k.inputs)]


def lrn_backward(tape: Tape, k: KernelDraft, dys: Grads, needs: list[bool]) -> Grads:
    dy = dys[0]
    assert dy is not None
    attrs = {"alpha": float(k.attr("alpha", 1e-4)), "beta": float(k.attr("beta", 0.75)),
             "bias": float(k.attr("bias", 1.0)), "size": int(k.attr("size"))}
    return [_emit_grad(tape, k, "LRNGrad", [dy, k.inputs[0], k.outputs[0]], k.inputs[0],
                       "grad", **attrs)]


def softmax_backward(tape: Tape, k: KernelDraft, dys: Grads, needs: list[bool]) -> Grads:
    dy = dys[0]
    assert dy is not None
    op = "SoftmaxGrad" if k.op_type == "Softmax" else "LogSoftmaxGrad"
    axis = int(k.attr("axis", -1)) % len(tape.shape(k.inputs[0]))
    return [_emit_grad(tape, k, op, [dy, k.outputs[0]], k.inputs[0], "grad", axis=axis)]


def _pool_attrs(tape: Tape, k: KernelDraft) -> dict[str, object]:
    x_shape = tape.shape(k.inputs[0])
    geo = window(k.attrs, x_shape[2:])
    return {"kernel_shape": geo.kernel, "strides": geo.strides, "pads": geo.pads,
            "dilations": geo.dilations, "ceil_mode": int(k.attr("ceil_mode", 0))}


def maxpool_backward(tape: Tape, k: KernelDraft, dys: Grads, needs: list[bool]) -> Grads:
    dy = dys[0]
    assert dy is not None
    return [_emit_grad(tape, k, "MaxPoolGrad", [dy, k.inputs[0]], k.inputs[0], "grad",
                       **_pool_attrs(tape, k))]


def avgpool_backward(tape: Tape, k: KernelDraft, dys: Grads, needs: list[bool]) -> Grads:
    dy = dys[0]
    assert dy is not None
    return [_emit_grad(tape, k, "AveragePoolGrad", [dy], k.inputs[0], "grad",
                       count_include_pad=int(k.attr("count_include_pad", 0)),
                       **_pool_attrs(tape, k))]


def global_pool_backward(tape: Tape, k: KernelDraft, dys: Grads, needs: list[bool]) -> Grads:
    dy = dys[0]
    assert dy is not None
    x = k.inputs[0]
    if k.op_type == "GlobalAveragePool":
        return [_emit_grad(tape, k, "GlobalAveragePoolGrad", [dy], x, "grad")]
    return [_emit_grad(tape, k, "GlobalMaxPoolGrad", [dy, x, k.outputs[0]], x, "grad")]


def cross_entropy_prepare(tape: Tape, k: KernelDraft) -> None:
    """The loss saves log-probabilities (ONNX's optional second output) for its backward."""
    if len(k.outputs) < 2:
        scores = k.inputs[0]
        k.outputs.append(tape.new_tensor(f"{tape.name(scores)}::log_prob", tape.shape(scores),
                                         tape.dtype(scores), Role.ACTIVATION))


def cross_entropy_backward(tape: Tape, k: KernelDraft, dys: Grads, needs: list[bool]) -> Grads:
    """The loss is the seed: d(loss) = 1, so no incoming gradient tensor is read. The gradient
    has the logits' dtype; where the log-probabilities are fp32 and the logits bf16 (our loss
    on bf16 logits, `ir/training.py`), `to` says so: the kernel computes in fp32 and writes
    bf16 (no Cast after it). It has no workspace: on CUDA one pass reads the log-probabilities
    and writes the gradient (`kernels.loss_grad`); the CPU's torch ops take an fp32 softmax
    temporary, which host mode (fp32 by default) does not count."""
    axis = int(k.attr("axis", 1 if k.domain == "" else -1))
    g = tape.new_grad(k.inputs[0])
    log_prob = k.outputs[1]
    mixed = tape.dtype(g) != tape.dtype(log_prob)
    tape.emit("SoftmaxCrossEntropyGrad", [log_prob, *k.inputs[1:]], [g],
              grad_name(k, "grad"), axis=axis % len(tape.shape(k.inputs[0])),
              reduction=str(k.attr("reduction", "mean")),
              ignore_index=k.attr("ignore_index"),
              **({"to": tape.dtype(g)} if mixed else {}))
    return [g] + [None] * (len(k.inputs) - 1)


RULES: dict[str, Rule] = {
    "Conv": Rule(conv_backward),
    "ConvTranspose": Rule(conv_transpose_backward),
    "Gemm": Rule(gemm_backward),
    "MatMul": Rule(matmul_backward),
    "BatchNormalization": Rule(batchnorm_backward, inputs=(0, 1, 2), prepare=batchnorm_prepare),
    "LayerNormalization": Rule(layernorm_backward, prepare=layernorm_prepare),
    "LRN": Rule(lrn_backward),
    "Softmax": Rule(softmax_backward),
    "LogSoftmax": Rule(softmax_backward),
    "MaxPool": Rule(maxpool_backward),
    "AveragePool": Rule(avgpool_backward),
    "GlobalAveragePool": Rule(global_pool_backward),
    "GlobalMaxPool": Rule(global_pool_backward),
    "SoftmaxCrossEntropyLoss": Rule(cross_entropy_backward, inputs=(0,),
                                    prepare=cross_entropy_prepare),
    "SoftmaxCrossEntropy": Rule(cross_entropy_backward, inputs=(0,),
                                prepare=cross_entropy_prepare),
}
