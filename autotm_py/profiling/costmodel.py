"""The analytical cost model: FLOPs and bytes per kernel on a device roofline.

    t(kernel) = launch_s + max(flops / (peak_flops[dtype] * compute_eff),
                               bytes / (bandwidth * memory_eff))

where bandwidth is the last-level cache's when the kernel's traffic fits in it (a two-level
memory roofline), else the memory's.

`bytes` is every input and output slot streamed once (the same rule as the host-mode slow-tier
model in `costs.py`); `flops` comes from a rule per op family (`flops_of`). Ops without a rule
count bytes only. Estimates are used for kernels that no profile covers and are flagged
`estimated`; the same work term (without the launch cost) gives the ratio by which a profile
measured at another batch is scaled (`profiling/scaling.py`).

Sources of the device numbers are next to each preset and in docs/profiling.md.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from autotm_py.ir.graph import DTYPE_SIZES
from autotm_py.ir.layout import CHANNELS_LAST
from autotm_py.ir.rules.fused import heads_first

if TYPE_CHECKING:
    from autotm_py.ir.graph import Kernel, TensorGraph

Shape = tuple[int, ...]
Slot = tuple[Shape, str]


# ---- a kernel as shapes only -----------------------------------------------------------------
@dataclass(frozen=True)
class OpShape:
    """What the cost model needs of a kernel: op, attributes, slot shapes and dtypes.

    Built from a graph kernel or parsed back from a profile signature, so profiles can be
    compared and scaled without the graph they were measured in.
    """

    op: str
    domain: str
    attrs: Mapping[str, Any]
    inputs: tuple[Slot, ...]
    outputs: tuple[Slot, ...]
    layout: str = ""  # "channels-last" where it reads or writes such images (`ir.layout`)

    @classmethod
    def of_kernel(cls, graph: TensorGraph, kernel: Kernel) -> OpShape:
        def slots(ids: tuple[int, ...]) -> tuple[Slot, ...]:
            return tuple((graph.tensors[t].shape, graph.tensors[t].dtype) for t in ids)

        layout = CHANNELS_LAST if any(graph.tensors[t].channels_last for t in kernel.io) else ""
        return cls(kernel.op_type, kernel.domain, kernel.attrs_dict, slots(kernel.inputs),
                   slots(kernel.outputs), layout)

    @classmethod
    def of_signature(cls, signature: str) -> OpShape:
        body = json.loads(signature)
        domain, _, op = body["op"].rpartition("::")

        def slots(items: list[Any]) -> tuple[Slot, ...]:
            return tuple((tuple(int(d) for d in shape), str(dtype)) for shape, dtype in items)

        return cls(op, domain, {k: _tuples(v) for k, v in body["attrs"]}, slots(body["in"]),
                   slots(body["out"]), body.get("layout", ""))

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)

    @property
    def bytes(self) -> int:
        return sum(numel(s) * DTYPE_SIZES.get(d, 4) for s, d in self.inputs + self.outputs)

    @property
    def dtype(self) -> str:
        """The float dtype the arithmetic runs in (first float slot; float32 if none)."""
        for _, d in self.outputs + self.inputs:
            if d.startswith(("float", "bfloat")):
                return d
        return "float32"


def _tuples(value: Any) -> Any:
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def numel(shape: Shape) -> int:
    return math.prod(shape) if shape else 1


# Ops that kernels/__init__.py runs as torch views of their input (no copy, no arithmetic):
# only the per-kernel cost remains.
VIEW_OPS = frozenset({"Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose",
                      "Expand", "Split", "Slice", "ReshapeGrad", "TransposeGrad", "ConcatGrad"})

# Kernels that stream their operands more than once: training-mode batch normalization reads
# X for the statistics and again to normalize; its gradient reads X and dY for the reductions
# and again for dX. The rotary embedding and its gradient (three launches: a product, then an
# addcmul_ into each half of the output) read X twice and write and read Y back: 5 X-sized
# passes where the bytes count 2 (COS and SIN broadcast, small). Traffic = bytes * factor.
MEMORY_PASSES: dict[str, float] = {"BatchNormalization": 1.5, "BatchNormGrad": 1.6,
                                   "LayerNormalization": 1.5, "LayerNormGrad": 1.6,
                                   "RMSNormalization": 1.5, "RMSNormGrad": 1.6,
                                   "RotaryEmbedding": 2.5, "RotaryEmbeddingGrad": 2.5}


# ---- FLOP rules --------------------------------------------------------------------------------
FlopRule = Callable[[OpShape], float]
FLOP_RULES: dict[str, FlopRule] = {}
"""op_type -> FLOPs of one kernel. Forward ops by ONNX name; backward/optimizer ops by ours."""


def _rule(*ops: str) -> Callable[[FlopRule], FlopRule]:
    def register(fn: FlopRule) -> FlopRule:
        for op in ops:
            FLOP_RULES[op] = fn
        return fn

    return register


def _out(s: OpShape, i: int = 0) -> int:
    return numel(s.outputs[i][0]) if len(s.outputs) > i else 0


def _in(s: OpShape, i: int = 0) -> int:
    return numel(s.inputs[i][0]) if len(s.inputs) > i else 0


def per_element(cost: float, *, of: str = "out") -> FlopRule:
    """`cost` FLOPs per element of the first output (or the largest input)."""
    if of == "out":
        return lambda s: cost * max(_out(s), 1)
    return lambda s: cost * max((numel(sh) for sh, _ in s.inputs), default=0)


def conv_flops(out_like: Shape, weight: Shape) -> float:
    """2 * (elements of the output-sized tensor) * (weights feeding each: Cin/g * prod(k))."""
    return 2.0 * numel(out_like) * (numel(weight) / max(weight[0], 1) if weight else 1)


@_rule("Conv", "ConvRelu")  # ConvRelu: the bias and the ReLU ride in the epilogue
def _conv(s: OpShape) -> float:
    return conv_flops(s.outputs[0][0], s.inputs[1][0])


@_rule("ConvTranspose")
def _conv_transpose(s: OpShape) -> float:
    # each input element scatters into Cout/g * prod(k) outputs
    return conv_flops(s.inputs[0][0], s.inputs[1][0])


@_rule("Gemm")
def _gemm(s: OpShape) -> float:
    a = s.inputs[0][0]
    k = a[0] if s.attr("transA", 0) else a[-1]
    return 2.0 * _out(s) * k


@_rule("MatMul")
def _matmul(s: OpShape) -> float:
    return 2.0 * _out(s) * s.inputs[0][0][-1]


def matrix_product_flops(a: Shape, b: Shape, y: Shape) -> float:
    """FLOPs of a (batched) matrix product from its three shapes, whichever of them is the
    result and whatever is transposed: per matrix (mk)(kn)(mn) = (mnk)^2, times the largest
    batch of the three (a gradient summed over a broadcast batch still did that many)."""
    def batch(s: Shape) -> int:
        return numel(s[:-2]) if len(s) > 2 else 1

    per = numel(a) / batch(a) * (numel(b) / batch(b)) * (numel(y) / batch(y))
    return 2.0 * max(batch(a), batch(b), batch(y)) * math.sqrt(per)


for _op in ("Relu", "LeakyRelu", "Abs", "Neg", "Clip", "Add", "Sub", "Mul", "Max", "Min",
            "Where", "Dropout", "Reciprocal"):
    FLOP_RULES[_op] = per_element(1)
for _op in ("Div", "Sqrt", "Pow"):
    FLOP_RULES[_op] = per_element(4)
for _op in ("Sigmoid", "Tanh", "Erf", "Gelu", "Silu", "Exp", "Log"):
    FLOP_RULES[_op] = per_element(8)
FLOP_RULES["Sum"] = lambda s: float(max(len(s.inputs) - 1, 1) * _out(s))
for _op in ("Softmax", "LogSoftmax"):
    FLOP_RULES[_op] = per_element(5)
FLOP_RULES["BatchNormalization"] = per_element(4)
FLOP_RULES["LayerNormalization"] = per_element(8)
FLOP_RULES["RMSNormalization"] = per_element(5)  # square, mean, rsqrt-scale, weight
# rotary: a product, then a multiply-add into each half (three passes over Y, two over X)
FLOP_RULES["RotaryEmbedding"] = per_element(3)
FLOP_RULES["LRN"] = lambda s: 2.0 * _out(s) * float(s.attr("size", 5))
FLOP_RULES["SoftmaxCrossEntropyLoss"] = per_element(6, of="in")
for _op in ("ReduceMean", "ReduceSum", "GlobalAveragePool", "GlobalMaxPool"):
    FLOP_RULES[_op] = per_element(1, of="in")


@_rule("MaxPool", "AveragePool")
def _pool(s: OpShape) -> float:
    return float(_out(s) * numel(tuple(s.attr("kernel_shape", ()) or ())))


# ---- backward, loss and optimizer ops (ir/rules TRAINING_OPS) -------------------------------
@_rule("ConvGradData")  # dY, W -> dX: the forward convolution's FLOPs
def _conv_grad_data(s: OpShape) -> float:
    return conv_flops(s.inputs[0][0], s.inputs[1][0])


@_rule("ConvGradFilter")  # dY, X -> dW
def _conv_grad_filter(s: OpShape) -> float:
    return conv_flops(s.inputs[0][0], s.outputs[0][0])


@_rule("ConvGrad")  # dY, X, W -> dX, dW[, dB]: ConvGradData + ConvGradFilter (+ ConvGradBias)
def _conv_grad(s: OpShape) -> float:
    dy = s.inputs[0][0]
    bias = numel(dy) if len(s.outputs) > 2 else 0
    return 2 * conv_flops(dy, s.inputs[2][0]) + bias


@_rule("ConvTransposeGrad")  # dY, X, W -> dX, dW[, dB]: both work over the forward input X
def _convt_grad(s: OpShape) -> float:
    bias = numel(s.inputs[0][0]) if len(s.outputs) > 2 else 0
    return 2 * conv_flops(s.inputs[1][0], s.inputs[2][0]) + bias


@_rule("ConvTransposeGradData")  # dY, W -> dX, dX is the forward input
def _convt_grad_data(s: OpShape) -> float:
    return conv_flops(s.outputs[0][0], s.inputs[1][0])


@_rule("ConvTransposeGradFilter")  # dY, X -> dW
def _convt_grad_filter(s: OpShape) -> float:
    return conv_flops(s.inputs[1][0], s.outputs[0][0])


@_rule("GemmGradA", "GemmGradB", "MatMulGradA", "MatMulGradB")
def _matrix_grad(s: OpShape) -> float:
    return matrix_product_flops(s.inputs[0][0], s.inputs[1][0], s.outputs[0][0])


@_rule("MaxPoolGrad", "AveragePoolGrad")  # window work over dY (MaxPool recomputes argmax)
def _pool_grad(s: OpShape) -> float:
    return float(2 * _in(s) * numel(tuple(s.attr("kernel_shape", ()) or ())))


for _op in ("ReluGrad", "LeakyReluGrad", "AbsGrad", "ClipGrad", "CastGrad", "DropoutGrad",
            "WhereGrad", "ConvGradBias", "SumToShape", "ReduceSumGrad", "ReduceMeanGrad",
            "GlobalAveragePoolGrad", "GlobalMaxPoolGrad", "TileGrad", "GatherGrad",
            "AdamStep"):
    FLOP_RULES[_op] = per_element(1, of="in")
for _op in ("MulGrad", "DivGradA", "SigmoidGrad", "TanhGrad", "SqrtGrad", "ReciprocalGrad",
            "ExpGrad", "MaxMinGrad", "ResizeGrad", "MeanSquaredError",
            "MeanSquaredErrorGrad"):
    FLOP_RULES[_op] = per_element(2, of="in")
for _op in ("DivGradB", "LogGrad", "SoftmaxGrad", "LogSoftmaxGrad",
            "SoftmaxCrossEntropyGrad"):
    FLOP_RULES[_op] = per_element(4, of="in")
for _op in ("ErfGrad", "GeluGrad", "SiluGrad", "PowGradBase", "PowGradExponent",
            "SoftmaxCrossEntropy"):
    FLOP_RULES[_op] = per_element(8, of="in")
FLOP_RULES["BatchNormGrad"] = per_element(8, of="in")
FLOP_RULES["LayerNormGrad"] = per_element(10, of="in")
FLOP_RULES["RMSNormGrad"] = per_element(8, of="in")
FLOP_RULES["RotaryEmbeddingGrad"] = per_element(3)  # the same three passes, for dX


@_rule("SGDUpdate", "AdamUpdate")
def _optimizer_update(s: OpShape) -> float:
    """Elementwise on W (ir/optim.py): 2 FLOPs per element for W - lr dW, 12 for Adam, 2 more
    for each of momentum, weight decay and Nesterov (the bytes: every slot, as for any op)."""
    base = 12 if s.op == "AdamUpdate" else 2 + (2 if s.attr("momentum", 0) else 0)
    extra = sum(2 for name in ("weight_decay", "nesterov") if s.attr(name, 0))
    return float((base + extra) * _in(s))


FLOP_RULES["LRNGrad"] = lambda s: 4.0 * _in(s) * float(s.attr("size", 5))
FLOP_RULES["GradAccumulate"] = lambda s: float(max(len(s.inputs) - 1, 1) * _out(s))


# ---- fused ops (ir/rules/fused.py) -------------------------------------------------------------
def attention_flops(q: Shape, k: Shape, v: Shape, causal: bool, matmuls: tuple[int, int],
                    pointwise: float) -> float:
    """FLOPs of attention over (..., L, E) queries and (..., S, E|Ev) keys/values:
    `matmuls` = (products of size L x S x E, of size L x S x Ev), 2 FLOPs per multiply-add,
    plus `pointwise` FLOPs per score (scale, mask, exp, sums); halved when causal (the fused
    kernels skip the blocks above the diagonal)."""
    batch = numel(q[:-2])
    ls = q[-2] * k[-2]
    work = batch * ls * (2.0 * (matmuls[0] * q[-1] + matmuls[1] * v[-1]) + pointwise)
    return work / 2 if causal else work


@_rule("ScaledDotProductAttention")  # Q K^T, softmax, P V
def _attention(s: OpShape) -> float:
    q, k, v = (heads_first(s.inputs[i][0], s.attr("layout")) for i in range(3))
    return attention_flops(q, k, v, bool(s.attr("is_causal", 0)), (1, 1), 5.0)


@_rule("ScaledDotProductAttentionGrad")  # dO, Q, K, V, ...: recompute Q K^T; dV, dP, dQ, dK
def _attention_grad(s: OpShape) -> float:
    q, k, v = (heads_first(s.inputs[i][0], s.attr("layout")) for i in range(1, 4))
    return attention_flops(q, k, v, bool(s.attr("is_causal", 0)), (3, 2), 8.0)


@_rule("Linear")  # X (..., K) op(W) + B: one product, the bias added per output element
def _linear(s: OpShape) -> float:
    return (2.0 * s.inputs[0][0][-1] + (len(s.inputs) > 2)) * _out(s)


@_rule("LinearGrad")  # dY, X, W -> dX, dW (a product each), dB (a row sum of dY)
def _linear_grad(s: OpShape) -> float:
    mask = s.attr("output_mask", (1, 1, 0))
    dy = _in(s)
    return (2.0 * s.inputs[1][0][-1] * (mask[0] + mask[1]) + mask[2]) * dy


def _chunked_loss_shape(s: OpShape) -> tuple[float, float, float]:
    """(rows, K, classes) of a chunked loss: X (..., K) and its weight W."""
    x, w = s.inputs[0][0], s.inputs[1][0]
    classes = w[0] if s.attr("transB", 0) else w[1]
    return float(numel(x[:-1])), float(x[-1]), float(classes)


@_rule("LinearCrossEntropy")  # each block's logits (a product), then log-sum-exp and pick
def _linear_cross_entropy(s: OpShape) -> float:
    rows, k, classes = _chunked_loss_shape(s)
    return rows * classes * (2.0 * k + 6.0)


@_rule("LinearCrossEntropyGrad")  # the logits again, their gradient, then dX and dW
def _linear_cross_entropy_grad(s: OpShape) -> float:
    rows, k, classes = _chunked_loss_shape(s)
    mask = s.attr("output_mask", (1, 1, 0))
    return rows * classes * (2.0 * k * (1 + mask[0] + mask[1]) + 6.0 + mask[2])


# ---- recurrent layers (ir/rules/recurrent.py) ---------------------------------------------------
def recurrent_flops(op: str, x: Shape, w: Shape) -> float:
    """FLOPs of an LSTM/GRU layer (or its gradient kernel) over X (T, B, I) (either layout)
    with W (D, G*H, I): per step, direction and gate element the input and recurrent products
    (2 FLOPs per multiply-add over I + H) and 3 for the activation and the state update. The
    gradient kernel recomputes the forward, then runs the products twice more (the gradients
    of the inputs and of the weights) and the gates' gradients. The steps' sequential
    dependency (one small product after the other) is not modelled: a roofline of the work."""
    gates = 4 if op.startswith("LSTM") else 3
    elements = numel(x) / max(x[-1], 1) * w[0] * w[1]  # T * B * D * G * H gate elements
    forward = elements * (2.0 * (x[-1] + w[1] / gates) + 3.0)
    return 3 * forward if op.endswith("Grad") else forward


@_rule("LSTM", "GRU", "LSTMGrad", "GRUGrad")
def _recurrent(s: OpShape) -> float:
    return recurrent_flops(s.op, s.inputs[0][0], s.inputs[1][0])


# ---- the device roofline ------------------------------------------------------------------------
@dataclass(frozen=True)
class Roofline:
    """Peak FLOP/s per dtype, memory bandwidth, achievable fractions and a per-kernel cost."""

    name: str
    peak_flops: Mapping[str, float]  # dtype -> FLOP/s; "tf32" is fp32 convolutions on GPUs
    mem_bw: float  # bytes/s
    launch_s: float  # fixed cost of one kernel (dispatch + launch)
    compute_eff: float = 0.6
    memory_eff: float = 0.8
    source: str = ""
    conv_tf32: bool = False  # fp32 convolutions run on tensor cores (cuDNN's default)
    extra: Mapping[str, Any] = field(default_factory=dict)
    # a kernel whose traffic fits the last-level cache streams at cache_bw instead of mem_bw
    cache_bw: float | None = None
    cache_bytes: int = 0

    def peak(self, dtype: str, conv: bool = False) -> float:
        if conv and self.conv_tf32 and dtype == "float32" and "tf32" in self.peak_flops:
            return self.peak_flops["tf32"]
        return self.peak_flops.get(dtype, self.peak_flops["float32"])

    def work_s(self, shape: OpShape) -> float:
        """The roofline time without the launch cost: what grows with the kernel's size."""
        if shape.op in VIEW_OPS:
            return 0.0
        flops = flops_of(shape)
        compute = flops / (self.peak(shape.dtype, "Conv" in shape.op) * self.compute_eff)
        traffic = shape.bytes * MEMORY_PASSES.get(shape.op, 1.0)
        in_cache = self.cache_bw is not None and traffic <= self.cache_bytes
        memory = traffic / ((self.cache_bw if in_cache else self.mem_bw) * self.memory_eff)
        return max(compute, memory)

    def time_s(self, shape: OpShape) -> float:
        return self.launch_s + self.work_s(shape)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["peak_flops"] = dict(self.peak_flops)
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Roofline:
        return cls(name=str(data["name"]), peak_flops=dict(data["peak_flops"]),
                   mem_bw=float(data["mem_bw"]), launch_s=float(data["launch_s"]),
                   compute_eff=float(data.get("compute_eff", 0.6)),
                   memory_eff=float(data.get("memory_eff", 0.8)),
                   source=str(data.get("source", "")),
                   conv_tf32=bool(data.get("conv_tf32", False)),
                   extra=dict(data.get("extra", {})),
                   cache_bw=None if data.get("cache_bw") is None else float(data["cache_bw"]),
                   cache_bytes=int(data.get("cache_bytes", 0)))


def flops_of(shape: OpShape) -> float:
    """FLOPs of one kernel: its op's rule, the family rule of a backward op, or 0 (bytes-only)."""
    rule = FLOP_RULES.get(shape.op)
    if rule is not None:
        try:
            return float(rule(shape))
        except (IndexError, KeyError, TypeError, ZeroDivisionError):
            return 0.0  # an unexpected slot layout: fall back to bytes only
    return 0.0


# H100 SXM5 80GB: HBM3 3.35 TB/s; dense peaks 67 TFLOP/s fp32 (no tensor cores; torch keeps
# fp32 matmul off TF32 by default), 494.7 TFLOP/s TF32 (cuDNN convolutions use it by default),
# 989.4 TFLOP/s bf16/fp16 (NVIDIA H100 datasheet). Efficiencies: the measured H100 profile's
# fitted 0.5 (compute) and 0.7 (memory) of *measured* peaks (52 TFLOP/s fp32, 422 TF32,
# 2.94 TB/s), expressed against the datasheet; launch_s: the dispatch cost measured there.
# Used only when no cuda profile file carries a measured roofline.
H100_SXM = Roofline(
    name="NVIDIA H100 SXM5 (datasheet)",
    peak_flops={"float32": 67e12, "tf32": 494.7e12, "bfloat16": 989.4e12, "float16": 989.4e12,
                "float64": 34e12},
    mem_bw=3.35e12, launch_s=10e-6, compute_eff=0.42, memory_eff=0.62, conv_tf32=True,
    source="NVIDIA H100 SXM5 datasheet peaks; efficiencies fitted to measured H100 profiles",
)

# The CPU of the shipped CPU profiles: one thread of the project's 2-core AMD EPYC (AVX-512,
# bf16), as `torch_profiler.measure_roofline` found it with torch 2.13 on 2026-11-26 (middle
# of three runs on the shared machine, load average about 2.8): fp32 matmul 82 GFLOP/s, bf16
# 254, 256 MiB copy 44 GB/s and in-cache (32 MiB L3) copy 99 GB/s, read + write. Used only
# when no cpu profile file carries a measured roofline.
CPU_REFERENCE = Roofline(
    name="AMD EPYC, 1 thread (measured)",
    peak_flops={"float32": 82e9, "bfloat16": 254e9, "float16": 254e9, "float64": 41e9},
    mem_bw=44e9, launch_s=1.5e-6, compute_eff=0.7, memory_eff=0.8, cache_bw=99e9,
    cache_bytes=32 << 20,
    source="torch_profiler.measure_roofline, 1 thread of the project's AMD EPYC, torch 2.13",
)
