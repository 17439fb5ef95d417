"""The RMSNorm and SiLU fusions (`frontend/fuse_rms_norm.py`, `frontend/fuse_silu.py`): the
exported forms of a Llama-style decoder become `RMSNormalization` and `Silu` kernels that
compute, and train, like the unfused graph; near misses and intermediates read elsewhere stay
unfused; the corpus Llama fuses every norm and gate, and its training graph shrinks."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from autotm_py import api
from autotm_py.cli import main
from autotm_py.frontend import fuse
from autotm_py.frontend.fuse import fuse_graph
from autotm_py.ir import Role, TensorGraph
from autotm_py.ir.rules.fused import (
    BLHE,
    RMS_NORM,
    RMS_NORM_GRAD,
    ROTARY,
    ROTARY_GRAD,
    SDPA,
    SILU,
    SILU_GRAD,
)
from autotm_py.ir.training import derive_training
from autotm_py.profiling.costmodel import H100_SXM, OpShape, flops_of, numel
from tests.fixtures.checks import assert_canonical
from tests.test_fuse import assert_same_outputs, ops
from tests.test_fuse_training import compare_with_unfused
from tests.test_training_models import Net
from tests.test_training_ops import compare_training

LLAMA = Path(__file__).resolve().parent.parent / "models" / "corpus" / "llama_gqa.onnx"
B, L, D = 2, 3, 8
UNFUSED_NORM = Counter({"Pow": 1, "ReduceMean": 1, "Add": 1, "Sqrt": 1, "Div": 1, "Mul": 2})


def _f32(value: float) -> np.ndarray:
    return np.array(value, dtype=np.float32)


# ---- RMSNorm, hand-built ------------------------------------------------------------------------
def rms_graph(*, square: str = "pow", inverse: str = "div", x_first: bool = True,
              eps_first: bool = False, weight: str = "after", leak: str = "", axis: int = 2,
              keepdims: int = 1, exponent: float = 2.0, numerator: float = 1.0,
              eps: float = 1e-6) -> TensorGraph:
    """x -> MatMul -> RMSNorm spelled as asked -> MatMul -> out. `weight`: "after" (Mul(N, W)),
    "before" (Mul(W, N)), "none", or "rows" (a (L, D) weight: not the norm's); `leak` names an
    intermediate that is also a graph output."""
    net = Net("rms")
    const = net.b.add_constant
    x = net.op("MatMul", [net.tensor((B, L, D), Role.INPUT, name="x"), net.weight(D, D)],
               (B, L, D))
    sq = net.op("Mul", [x, x], (B, L, D)) if square == "mul" else \
        net.op("Pow", [x, const("two", _f32(exponent))], (B, L, D))
    ms_shape = (B, L, 1) if keepdims else (B, L)
    ms = net.op("ReduceMean", [sq], ms_shape, axes=(axis,), keepdims=keepdims)
    e = const("eps", _f32(eps))
    v = net.op("Add", [e, ms] if eps_first else [ms, e], ms_shape)
    r = net.op("Sqrt", [v], ms_shape)
    if inverse == "divide-x":
        inv, n = r, net.op("Div", [x, r], (B, L, D))
    else:
        inv = net.op("Reciprocal", [r], ms_shape) if inverse == "reciprocal" else \
            net.op("Div", [const("one", _f32(numerator)), r], ms_shape)
        n = net.op("Mul", [x, inv] if x_first else [inv, x], (B, L, D))
    y = n
    if weight != "none":
        w = net.weight(L, D) if weight == "rows" else net.weight(D)
        y = net.op("Mul", [n, w] if weight == "after" else [w, n], (B, L, D))
    out = net.op("MatMul", [y, net.weight(D, D)], (B, L, D))
    if leak:
        net.b.outputs.append({"square": sq, "mean": ms, "root": r, "inverse": inv,
                              "normalized": n}[leak])
    return net.build(out)


RMS_FUSED = {
    "pow-div": {}, "mul-square": {"square": "mul"}, "reciprocal": {"inverse": "reciprocal"},
    "divide-x": {"inverse": "divide-x"}, "inverse-first": {"x_first": False},
    "eps-first": {"eps_first": True}, "weight-first": {"weight": "before"},
    "no-weight": {"weight": "none"}, "eps-0.1": {"eps": 0.1},
}


@pytest.mark.parametrize("variant", sorted(RMS_FUSED))
def test_rms_norm_spellings_fuse_compute_and_train_the_same(variant):
    graph = rms_graph(**RMS_FUSED[variant])
    fused = fuse_graph(graph)
    assert fused.meta["fusion"]["rms_norm"] == 1
    assert_canonical(fused)
    (k,) = [k for k in fused.kernels if k.op_type == RMS_NORM]
    assert k.domain == "autotm" and k.attr("axis") == 2
    assert k.attr("epsilon") == pytest.approx(RMS_FUSED[variant].get("eps", 1e-6), rel=1e-6)
    assert len(k.inputs) == (1 if variant == "no-weight" else 2)
    assert set(ops(fused)) == {"MatMul", RMS_NORM}
    assert_same_outputs(graph, fused)
    compare_with_unfused(graph, fused)
    train = derive_training(fused)
    assert ops(train)[RMS_NORM_GRAD] == 1
    (norm,) = [k for k in train.kernels if k.op_type == RMS_NORM]
    assert train.tensors[norm.outputs[1]].shape == (B, L, 1)  # one rstd per row is saved


@pytest.mark.parametrize("leak", ["square", "mean", "root", "inverse"])
def test_an_intermediate_read_elsewhere_blocks_the_fusion(leak):
    graph = rms_graph(leak=leak)
    fused = fuse_graph(graph)
    assert fused.meta["fusion"]["rms_norm"] == 0
    assert ops(fused) == ops(graph)


def test_a_normalized_x_read_elsewhere_keeps_the_weight_multiply():
    """N is also a graph output: the normalization fuses and produces N, the weight's Mul
    stays and reads it."""
    graph = rms_graph(leak="normalized")
    fused = fuse_graph(graph)
    assert fused.meta["fusion"]["rms_norm"] == 1
    assert ops(fused) == Counter({"MatMul": 2, RMS_NORM: 1, "Mul": 1})
    (k,) = [k for k in fused.kernels if k.op_type == RMS_NORM]
    assert len(k.inputs) == 1
    assert_same_outputs(graph, fused)


def test_a_weight_that_is_not_per_feature_stays_a_multiply():
    graph = rms_graph(weight="rows")
    fused = fuse_graph(graph)
    assert fused.meta["fusion"]["rms_norm"] == 1
    assert ops(fused)["Mul"] == 1
    assert_same_outputs(graph, fused)
    compare_with_unfused(graph, fused)


@pytest.mark.parametrize("variant", [{"axis": 1}, {"keepdims": 0}, {"exponent": 3.0},
                                     {"numerator": 2.0}, {"eps": -1e-6}],
                         ids=["axis-not-last", "no-keepdims", "cube", "two-over-root",
                              "negative-eps"])
def test_near_misses_stay_unfused(variant):
    graph = rms_graph(**variant) if "axis" not in variant else _mean_over_rows()
    fused = fuse_graph(graph)
    assert fused.meta["fusion"]["rms_norm"] == 0
    assert ops(fused) == ops(graph)


def _mean_over_rows() -> TensorGraph:
    """x / sqrt(mean over L + eps): a norm over another axis than the last."""
    net = Net("rms_rows")
    const = net.b.add_constant
    x = net.tensor((B, L, D), Role.INPUT, name="x")
    sq = net.op("Pow", [x, const("two", _f32(2.0))], (B, L, D))
    ms = net.op("ReduceMean", [sq], (B, 1, D), axes=(1,), keepdims=1)
    r = net.op("Sqrt", [net.op("Add", [ms, const("eps", _f32(1e-6))], (B, 1, D))], (B, 1, D))
    return net.build(net.op("Div", [x, r], (B, L, D)))


# ---- SiLU, hand-built ---------------------------------------------------------------------------
def swiglu_graph(*, sigmoid_first: bool = False, leak: bool = False,
                 gated_by_up: bool = False) -> TensorGraph:
    """down(silu(gate(x)) * up(x)); `gated_by_up`: up(x) * sigmoid(gate(x)) (a GLU, no SiLU)."""
    net = Net("swiglu")
    x = net.tensor((B, L, D), Role.INPUT, name="x")
    g = net.op("MatMul", [x, net.weight(D, 2 * D)], (B, L, 2 * D))
    u = net.op("MatMul", [x, net.weight(D, 2 * D)], (B, L, 2 * D))
    s = net.op("Sigmoid", [g], (B, L, 2 * D))
    other = u if gated_by_up else g
    a = net.op("Mul", [s, other] if sigmoid_first else [other, s], (B, L, 2 * D))
    h = a if gated_by_up else net.op("Mul", [a, u], (B, L, 2 * D))
    if leak:
        net.b.outputs.append(s)
    return net.build(net.op("MatMul", [h, net.weight(2 * D, D)], (B, L, D)))


@pytest.mark.parametrize("sigmoid_first", [False, True])
def test_silu_fuses_in_either_order_and_trains_the_same(sigmoid_first):
    graph = swiglu_graph(sigmoid_first=sigmoid_first)
    fused = fuse_graph(graph)
    assert fused.meta["fusion"]["silu"] == 1
    assert_canonical(fused)
    assert ops(fused) == Counter({"MatMul": 3, SILU: 1, "Mul": 1})  # SwiGLU: Silu + Mul
    assert_same_outputs(graph, fused)
    compare_with_unfused(graph, fused)
    compare_training(fused, steps=2)  # SiluGrad against autograd of the fused forward
    assert ops(derive_training(fused))[SILU_GRAD] == 1


@pytest.mark.parametrize("variant", [{"leak": True}, {"gated_by_up": True}],
                         ids=["sigmoid-read-elsewhere", "sigmoid-times-another-tensor"])
def test_silu_near_misses_stay_unfused(variant):
    graph = swiglu_graph(**variant)
    fused = fuse_graph(graph)
    assert fused.meta["fusion"]["silu"] == 0
    assert ops(fused) == ops(graph)


# ---- the corpus Llama ---------------------------------------------------------------------------
def _without_llama_fusions(monkeypatch) -> TensorGraph:
    """The corpus Llama as the pass imported it before these two fusions."""
    find = fuse.find_rewrites
    monkeypatch.setattr(fuse, "find_rewrites", lambda g, *round_: [
        r for r in find(g, *round_) if r.kind not in ("rms_norm", "silu")])
    return api.import_onnx(LLAMA)


def test_the_corpus_llama_fuses_every_norm_and_gate(monkeypatch):
    fused = api.import_onnx(LLAMA)
    assert fused.meta["fusion"]["rms_norm"] == 5 and fused.meta["fusion"]["silu"] == 2
    got = ops(fused)
    assert got[RMS_NORM] == 5 and got[SILU] == 2
    assert not {"Pow", "ReduceMean", "Sqrt", "Div", "Sigmoid"} & set(got)
    before = _without_llama_fusions(monkeypatch)
    # 7 kernels per norm and 2 per gate became one each
    assert len(before.kernels) - len(fused.kernels) == 5 * 6 + 2 * 1
    train, train_before = derive_training(fused), derive_training(before)
    assert len(train.kernels) < len(train_before.kernels)
    assert ops(train)[RMS_NORM_GRAD] == 5 and ops(train)[SILU_GRAD] == 2
    assert train.peak_live_bytes < train_before.peak_live_bytes


def test_the_corpus_llama_computes_and_trains_like_its_unfused_import():
    unfused = api.import_onnx(LLAMA, fuse=False)
    fused = api.import_onnx(LLAMA)
    assert_same_outputs(unfused, fused)
    compare_with_unfused(unfused, fused, steps=2)


def test_the_corpus_llamas_attention_runs_heads_last_through_rotary_and_repeated_heads():
    """`fuse_heads`: q and k rotated and k and v repeated (GQA) after the heads' Transposes;
    rewritten in (B, L, H, E), no Transpose is left forward or backward (the numbers: the
    test above and tests/test_fuse_rotary.py's transformers Llama)."""
    fused = api.import_onnx(LLAMA)
    assert fused.meta["fusion"]["heads_last"] == 2
    got = ops(fused)
    assert "Transpose" not in got and got["Unsqueeze"] == 4
    by_op = {op: [k for k in fused.kernels if k.op_type == op] for op in (SDPA, ROTARY)}
    assert all(k.attr("layout") == BLHE for k in by_op[SDPA] + by_op[ROTARY])
    for k in by_op[ROTARY]:  # (B, L, H, E) in and out, the tables as they were
        _, length, heads, _ = fused.tensors[k.outputs[0]].shape
        assert length == 16 and heads in (2, 4)  # k's 2 heads before they are repeated
        assert fused.tensors[k.inputs[1]].shape == (16, 8)
    train = derive_training(fused)
    assert not {"Transpose", "TransposeGrad"} & set(ops(train))
    assert all(k.attr("layout") == BLHE for k in train.kernels if k.op_type == ROTARY_GRAD)


def test_a_head_transpose_read_elsewhere_keeps_its_layer_as_it_was(tmp_path):
    import onnx

    model = onnx.load(str(LLAMA))
    first = next(n for n in model.graph.node if n.op_type == "Transpose")
    model.graph.output.append(onnx.helper.make_empty_tensor_value_info(first.output[0]))
    path = tmp_path / "leak.onnx"
    onnx.save(model, str(path))
    fused = api.import_onnx(path)
    assert fused.meta["fusion"]["heads_last"] == 1  # the other layer's
    assert ops(fused)["Transpose"] == 4


def test_inspect_names_the_llama_fusions(capsys):
    assert main(["inspect", str(LLAMA), "--training", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["fused"]["rms_norm"] == 5 and report["fused"]["silu"] == 2
    assert report["ops"][RMS_NORM] == 5 and report["ops"][RMS_NORM_GRAD] == 5
    assert report["ops"][SILU] == 2 and report["ops"][SILU_GRAD] == 2
    assert main(["inspect", str(LLAMA)]) == 0
    assert "5 rms_norm, 2 silu" in capsys.readouterr().out


def test_the_cost_model_prices_the_new_ops_below_the_kernels_they_replace():
    def shape(op: str, ins: list, outs: list, **attrs) -> OpShape:
        return OpShape(op, "autotm", attrs, tuple((s, "float32") for s in ins),
                       tuple((s, "float32") for s in outs))

    x, w, row = (4, 512, 1024), (1024,), (4, 512, 1)
    norm = shape(RMS_NORM, [x, w], [x], axis=2, epsilon=1e-6)
    grad = shape(RMS_NORM_GRAD, [x, x, row, w], [x, w], axis=2, output_mask=(1, 1))
    for s in (norm, grad, shape(SILU, [x], [x]), shape(SILU_GRAD, [x, x], [x])):
        assert flops_of(s) >= numel(x)
    chain = [shape("Pow", [x, ()], [x]), shape("ReduceMean", [x], [row]),
             shape("Add", [row, ()], [row]), shape("Sqrt", [row], [row]),
             shape("Div", [(), row], [row]), shape("Mul", [x, row], [x]),
             shape("Mul", [w, x], [x])]
    assert H100_SXM.time_s(norm) < sum(H100_SXM.time_s(s) for s in chain) / 2
    pair = [shape("Sigmoid", [x], [x]), shape("Mul", [x, x], [x])]
    assert H100_SXM.time_s(shape(SILU, [x], [x])) < sum(H100_SXM.time_s(s) for s in pair)
