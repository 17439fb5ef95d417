"""The fusion pass recognizes attention and GELU where the fused op computes the same function,
and nowhere else: zoo models, committed and fresh torch exports, hand-built variants and
near misses (wrong constants, softmax over another axis, a mask before the scale, shared
intermediates...). Numbers: the fused graph's outputs equal the unfused graph's."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import torch

from autotm_py.frontend.fuse import fuse_graph
from autotm_py.frontend.onnx import import_onnx
from autotm_py.frontend.zoo import build_graph
from autotm_py.ir import Role, TensorGraph
from autotm_py.ir.rules.fused import BLHE, SDPA
from autotm_py.runtime.reference import init_values, run_graph
from tests.fixtures import onnx_models as M
from tests.test_training_models import Net

FIXTURES = M.__file__.rsplit("/", 1)[0]
B, H, L, E = 2, 2, 4, 3
D = H * E


def ops(graph: TensorGraph) -> Counter[str]:
    return Counter(k.op_type for k in graph.kernels)


def attention_kernels(graph: TensorGraph) -> list:
    return [k for k in graph.kernels if k.op_type == SDPA]


def values_by_name(src: TensorGraph, values: dict, dst: TensorGraph) -> dict:
    """`dst`'s leaf values taken by name from `src`'s (new constants from dst itself)."""
    own = init_values(dst)
    return {t.id: values[src.by_name(t.name).id] if t.name in src.tensor_ids_by_name
            and t.id not in dst.constants else own[t.id]
            for t in dst.tensors if t.producer is None}


def assert_same_outputs(unfused: TensorGraph, fused: TensorGraph, rtol: float = 1e-5,
                        fixed: dict[str, np.ndarray] | None = None) -> None:
    values = init_values(unfused, seed=1)
    for name, value in (fixed or {}).items():
        values[unfused.by_name(name).id] = torch.as_tensor(value)
    want = run_graph(unfused, values)
    got = run_graph(fused, values_by_name(unfused, values, fused))
    for tid in unfused.outputs:
        ref = want[tid]
        out = got[fused.by_name(unfused.name_of(tid)).id]
        err = float((out - ref).abs().max())
        assert err <= 1e-6 + rtol * float(ref.abs().max()), (unfused.name_of(tid), err)


# ---- hand-built attention and its variants -----------------------------------------------------
def attention_graph(scale: str = "div", mask: str = "none", axis: int = 3,
                    key: str = "transpose", probs_out: bool = False,
                    heads_out: bool = False) -> TensorGraph:
    """x -> q, k, v projections -> heads -> scores -> scale -> mask -> softmax -> @ v -> out.
    `heads_out`: the values with their heads split off are a graph output too."""
    net = Net("attn")
    x = net.tensor((B, L, D), Role.INPUT, name="x")

    def heads(perm: tuple[int, ...], shape: tuple[int, ...]) -> int:
        h = net.op("MatMul", [x, net.weight(D, D)], (B, L, D))
        h = net.op("Reshape", [h], (B, L, H, E), shape=(B, L, H, E))
        return net.op("Transpose", [h], shape, perm=perm)

    q = heads((0, 2, 1, 3), (B, H, L, E))
    if key == "transpose":
        kt = heads((0, 2, 3, 1), (B, H, E, L))
    else:  # K^T made by a Reshape: not provably a transpose of anything
        kt = net.op("Reshape", [heads((0, 2, 1, 3), (B, H, L, E))], (B, H, E, L),
                    shape=(B, H, E, L))
    v = heads((0, 2, 1, 3), (B, H, L, E))
    const = net.b.add_constant
    if scale == "qk":
        c = const("c", np.array(E ** -0.25, dtype=np.float32))
        q = net.op("Mul", [q, c], (B, H, L, E))
        kt = net.op("Mul", [c, kt], (B, H, E, L))
    s = net.op("MatMul", [q, kt], (B, H, L, L))
    if mask == "add-before-scale":
        s = net.op("Add", [s, const("m", np.tri(L, L, dtype=np.float32) - 1.0)], (B, H, L, L))
    if scale == "div":
        s = net.op("Div", [s, const("sqrt_e", np.array(math.sqrt(E), dtype=np.float32))],
                   (B, H, L, L))
    elif scale == "custom":
        s = net.op("Mul", [const("c", np.array(0.3, dtype=np.float32)), s], (B, H, L, L))
    elif scale == "vector":  # a per-head scale: not a scalar
        s = net.op("Mul", [s, const("c", np.array([0.5, 0.25], np.float32).reshape(1, H, 1, 1))],
                   (B, H, L, L))
    s = _mask(net, s, mask)
    p = net.op("Softmax", [s], (B, H, L, L), axis=axis)
    ctx = net.op("MatMul", [p, v], (B, H, L, E))
    ctx = net.op("Transpose", [ctx], (B, L, H, E), perm=(0, 2, 1, 3))
    ctx = net.op("Reshape", [ctx], (B, L, D), shape=(B, L, D))
    out = net.op("MatMul", [ctx, net.weight(D, D)], (B, L, D))
    if probs_out:
        net.b.outputs.append(p)
    if heads_out:
        net.b.outputs.append(v)
    return net.build(out)


def _mask(net: Net, s: int, mask: str) -> int:
    const = net.b.add_constant
    shape = (B, H, L, L)
    tril = np.tri(L, L, dtype=bool)
    big = const("big", np.array(-1e9, dtype=np.float32)) if mask in (
        "where-causal", "where-fill-first", "where-window", "where-full-row",
        "where-causal-add-input") else None
    if mask == "add-const":
        return net.op("Add", [const("m", np.random.default_rng(0).standard_normal(
            (1, 1, L, L)).astype(np.float32)), s], shape)
    if mask == "add-causal":  # a folded causal mask, additive with -inf above the diagonal
        return net.op("Add", [s, const("m", np.where(tril, 0.0, -np.inf).astype(np.float32))],
                      shape)
    if mask in ("add-input", "add-weight"):
        m = net.tensor((B, 1, 1, L), Role.INPUT if mask == "add-input" else Role.WEIGHT,
                       name="pad_mask")
        return net.op("Add", [s, m], shape)
    if mask == "where-causal":
        return net.op("Where", [const("keep", tril), s, big], shape)
    if mask == "where-causal-add-input":  # HF GPT-2: causal Where, then the padding mask
        s = net.op("Where", [const("keep", tril), s, big], shape)
        return net.op("Add", [s, net.tensor((B, 1, 1, L), Role.INPUT, name="pad_mask")], shape)
    if mask == "where-fill-first":  # Where(masked, fill, scores), as torch exports masked_fill
        return net.op("Where", [const("drop", ~tril), big, s], shape)
    if mask == "where-window":  # not causal: a band of width 2
        band = tril & ~np.tri(L, L, -2, dtype=bool)
        return net.op("Where", [const("keep", band), s, big], shape)
    if mask == "where-small-fill":  # -1 does not mask anything out
        return net.op("Where", [const("keep", tril), s, const("f", np.float32(-1.0))], shape)
    if mask == "where-full-row":
        keep = tril.copy()
        keep[2] = False
        return net.op("Where", [const("keep", keep), s, big], shape)
    if mask == "where-runtime":
        cond = net.tensor((B, 1, 1, L), Role.INPUT, "bool", name="keep")
        return net.op("Where", [cond, s, const("f", np.float32(-np.inf))], shape)
    return s


FUSED_VARIANTS = {
    "div-no-mask": {},
    "custom-scalar-scale": {"scale": "custom"},
    "no-scale": {"scale": "none"},
    "scale-on-q-and-k": {"scale": "qk"},
    "additive-constant": {"mask": "add-const"},
    "additive-causal-constant": {"mask": "add-causal"},
    "additive-input": {"mask": "add-input"},
    "where-causal": {"mask": "where-causal"},
    "where-fill-first": {"mask": "where-fill-first"},
    "where-band": {"mask": "where-window"},
    "where-runtime-inf": {"mask": "where-runtime"},
    "causal-and-additive": {"mask": "where-causal-add-input"},
}


@pytest.mark.parametrize("variant", sorted(FUSED_VARIANTS))
def test_attention_variants_fuse_and_compute_the_same(variant):
    graph = attention_graph(**FUSED_VARIANTS[variant])
    fused = fuse_graph(graph)
    assert fused.meta["fusion"] == {"attention": 1, "gelu": 0, "linear": 0, "conv_relu": 0,
                                    "rms_norm": 0, "silu": 0, "rotary": 0, "heads_last": 0}
    (k,) = attention_kernels(fused)
    assert not {"Softmax", "Where", "Div"} & set(ops(fused))
    assert ops(fused)["MatMul"] == 4  # projections only
    want_scale = {"custom": 0.3, "none": 1.0}.get(FUSED_VARIANTS[variant].get("scale", ""),
                                                   1 / math.sqrt(E))
    assert k.attr("scale") == pytest.approx(want_scale, rel=1e-6)
    causal = variant in ("additive-causal-constant", "where-causal", "where-fill-first",
                         "causal-and-additive")
    assert k.attr("is_causal") == int(causal)
    has_mask = "mask" in FUSED_VARIANTS[variant]
    masked = variant == "causal-and-additive" or (not causal and has_mask)
    assert len(k.inputs) == 3 + masked
    q, key, v = (fused.tensors[t].shape for t in k.inputs[:3])
    # the Transposes that split the heads off and merge them back are absorbed: Q, K, V
    # and O stay (B, L, H, E), as the projections made them
    assert q == key == v == fused.tensors[k.outputs[0]].shape == (B, L, H, E)
    assert k.attr("layout") == "blhe" and "Transpose" not in ops(fused)
    # a run-time mask that leaves every row a key (a fully masked row is NaN unfused)
    keep = np.array([True, False, True, True]).reshape(1, 1, 1, L).repeat(B, axis=0)
    assert_same_outputs(graph, fused, fixed={"keep": keep} if "runtime" in variant else None)


def test_attention_keeps_heads_first_when_a_head_transpose_stays():
    """A transposed operand read outside the attention (here V, a graph output too) keeps the
    (B, H, L, E) layout: only K's Transpose is rewritten, as before."""
    graph = attention_graph(heads_out=True)
    fused = fuse_graph(graph)
    (k,) = attention_kernels(fused)
    assert k.attr("layout") is None
    assert [fused.tensors[t].shape for t in k.inputs[:3]] == [(B, H, L, E)] * 3
    assert ops(fused)["Transpose"] == 4  # q, v (kept), K's rewritten one, the output's
    assert_same_outputs(graph, fused)


NEAR_MISSES = {
    "softmax-not-last-axis": {"axis": 2},
    "per-head-scale": {"scale": "vector"},
    "key-not-a-transpose": {"key": "reshape"},
    "mask-before-scale": {"mask": "add-before-scale"},
    "mask-depends-on-weight": {"mask": "add-weight"},
    "fill-does-not-mask": {"mask": "where-small-fill"},
    "fully-masked-row": {"mask": "where-full-row"},
    "probabilities-also-an-output": {"probs_out": True},
}


@pytest.mark.parametrize("variant", sorted(NEAR_MISSES))
def test_attention_near_misses_stay_unfused(variant):
    graph = attention_graph(**NEAR_MISSES[variant])
    fused = fuse_graph(graph)
    assert fused.meta["fusion"]["attention"] == 0
    assert fused.kernels == graph.kernels and fused.tensors == graph.tensors


# ---- GELU forms and near misses ---------------------------------------------------------------
def gelu_graph(form: str) -> TensorGraph:
    """x (an affine layer's output) -> a GELU spelling -> a second layer."""
    net = Net("gelu")
    shape = (2, 5, 7)
    inp = net.tensor((2, 5, 4), Role.INPUT, name="inp")
    x = net.op("Add", [net.op("MatMul", [inp, net.weight(4, 7)], shape), net.weight(7)], shape)
    consts: dict[float, int] = {}

    def c(value: float) -> int:
        if value not in consts:
            consts[value] = net.b.add_constant(f"c{len(consts)}", np.array(value, np.float32))
        return consts[value]

    def op(name: str, *args: int) -> int:
        return net.op(name, list(args), shape)

    out = _gelu_form(form, x, c, op, net)
    return net.build(net.op("MatMul", [out, net.weight(7, 3)], (2, 5, 3)))


def _gelu_form(form: str, x: int, c, op, net: Net) -> int:
    s2, k = math.sqrt(2.0), math.sqrt(2.0 / math.pi)
    if form in ("erf", "erf-sqrt3", "erf-no-half", "erf-0.6", "erf-shared"):
        denom = math.sqrt(3.0) if form == "erf-sqrt3" else s2
        e = op("Erf", op("Div", x, c(denom)))
        y = op("Mul", x, op("Add", e, c(1.0)))
        if form != "erf-no-half":
            y = op("Mul", y, c(0.6 if form == "erf-0.6" else 0.5))
        if form == "erf-shared":
            net.b.outputs.append(e)
        return y
    if form == "erf-mul-first":  # (0.5 * x) * (erf(x * 1/sqrt 2) + 1), 1 + on the left
        e = op("Erf", op("Mul", c(1 / s2), x))
        return op("Mul", op("Mul", c(0.5), x), op("Add", c(1.0), e))
    if form == "erf-other-leaf":  # 0.5 * y * (1 + erf(x / sqrt 2)) with y != x
        y = op("Relu", x)
        return op("Mul", op("Mul", y, c(0.5)), op("Add", op("Erf", op("Div", x, c(s2))), c(1.0)))
    if form in ("tanh-pow", "tanh-wrong-kappa"):  # GPT-2's gelu_new
        kappa = 0.04 if form == "tanh-wrong-kappa" else 0.044715
        cube = op("Mul", op("Pow", x, c(3.0)), c(kappa))
        t = op("Tanh", op("Mul", op("Add", x, cube), c(k)))
        return op("Mul", op("Mul", x, c(0.5)), op("Add", t, c(1.0)))
    if form == "tanh-torch":  # torch's opset-9 symbolic: x * x * x, constants distributed
        cube = op("Mul", x, op("Mul", x, x))
        inner = op("Add", op("Mul", c(k), x), op("Mul", c(k * 0.044715), cube))
        return op("Mul", c(0.5), op("Mul", x, op("Add", c(1.0), op("Tanh", inner))))
    raise ValueError(form)


@pytest.mark.parametrize(("form", "approximate"), [
    ("erf", "none"), ("erf-mul-first", "none"), ("tanh-pow", "tanh"), ("tanh-torch", "tanh")])
def test_gelu_forms_fuse_and_compute_the_same(form, approximate):
    graph = gelu_graph(form)
    fused = fuse_graph(graph)
    assert fused.meta["fusion"] == {"attention": 0, "gelu": 1, "linear": 1, "conv_relu": 0,
                                    "rms_norm": 0, "silu": 0, "rotary": 0, "heads_last": 0}
    (gelu,) = [k for k in fused.kernels if k.op_type == "Gelu"]
    assert gelu.attr("approximate") == approximate and gelu.domain == ""
    assert set(ops(fused)) == {"Linear", "MatMul", "Gelu"}  # the layer before has a bias
    assert not any(t.role is Role.CONSTANT for t in fused.tensors)  # the 0.5, 1, sqrt 2 went
    assert_same_outputs(graph, fused)


@pytest.mark.parametrize("form", ["erf-sqrt3", "erf-no-half", "erf-0.6", "erf-shared",
                                  "erf-other-leaf", "tanh-wrong-kappa"])
def test_gelu_near_misses_stay_unfused(form):
    graph = gelu_graph(form)
    fused = fuse_graph(graph)
    assert fused.meta["fusion"] == {"attention": 0, "gelu": 0, "linear": 1, "conv_relu": 0,
                                    "rms_norm": 0, "silu": 0, "rotary": 0, "heads_last": 0}
    # only the layer before the GELU (MatMul + bias) became one kernel
    assert ops(fused) == ops(graph) - Counter({"MatMul": 1, "Add": 1}) + Counter({"Linear": 1})


# ---- zoo models and torch exports ----------------------------------------------------------------
@pytest.mark.parametrize(("name", "attention", "gelu", "approximate", "linear"), [
    ("bert_base", 12, 13, "none", 74), ("gpt2_small", 12, 12, "tanh", 49),
    ("transformer", 24, 0, None, 129)])
def test_zoo_models_fuse_every_block(name, attention, gelu, approximate, linear):
    fused = build_graph(name, batch=1, dims={"seq": 8})
    plain = build_graph(name, batch=1, dims={"seq": 8}, fuse=False)
    assert "fusion" not in plain.meta and "Linear" not in ops(plain)
    assert fused.meta["fusion"] == {"attention": attention, "gelu": gelu, "linear": linear,
                                    "conv_relu": 0, "rms_norm": 0, "silu": 0, "rotary": 0,
                                    "heads_last": 0}
    counts = ops(fused)
    assert counts[SDPA] == attention and counts["Gelu"] == gelu and counts["Linear"] == linear
    # every projection with a bias, and the tied output embedding (its Transpose absorbed)
    tied = [k for k in fused.kernels if k.op_type == "Linear" and k.attr("transB")]
    assert len(tied) == 1
    assert not {"Softmax", "Erf", "Tanh"} & set(counts)
    assert {k.attr("approximate") for k in fused.kernels if k.op_type == "Gelu"} <= {approximate}
    assert {k.attr("scale") for k in attention_kernels(fused)} == {0.125}
    # masks computed at run time from the ids' shape fuse as additive (seq, seq) masks
    decoder = {"gpt2_small": 12, "transformer": 8}.get(name, 0)
    assert sum(len(k.inputs) == 4 for k in attention_kernels(fused)) == decoder
    assert len(fused.kernels) < len(plain.kernels)
    assert fused.model_hash != plain.model_hash


def test_zoo_fused_forward_equals_unfused():
    for name in ("bert_base", "gpt2_small", "transformer"):
        assert_same_outputs(build_graph(name, batch=1, dims={"seq": 6}, fuse=False),
                            build_graph(name, batch=1, dims={"seq": 6}), rtol=1e-4)


def test_committed_tiny_gpt_fixture_fuses_causal_attention():
    path = f"{FIXTURES}/tiny_gpt_opset17.onnx"
    fused = import_onnx(path, dims={"batch": 2, "seq": 4})
    assert fused.meta["fusion"] == {"attention": 2, "gelu": 2, "linear": 8, "conv_relu": 0,
                                    "rms_norm": 0, "silu": 0, "rotary": 0, "heads_last": 0}
    for k in attention_kernels(fused):
        assert k.attr("is_causal") == 1 and len(k.inputs) == 3  # the folded mask is dropped
        assert k.attr("scale") == 0.25
    assert "Where" not in ops(fused)
    assert_same_outputs(import_onnx(path, dims={"batch": 2, "seq": 4}, fuse=False), fused)


@pytest.mark.parametrize(("opset", "mask"), [(11, "buffer"), (14, "tril"), (17, "tril")])
def test_exported_gpt_fuses_at_every_opset(tmp_path, opset, mask):
    path = M.torch_gpt(tmp_path / "gpt.onnx", opset, mask=mask, layers=1)
    fused = import_onnx(path, batch=2, dims={"seq": 5})
    # before opset 17 a LayerNorm is exported as ReduceMean, Sub, then the RMSNorm chain on
    # x - mean: that second half fuses (3 norms: two per block and the final one)
    rms = 3 if opset < 17 else 0
    assert fused.meta["fusion"] == {"attention": 1, "gelu": 1, "linear": 4, "conv_relu": 0,
                                    "rms_norm": rms, "silu": 0, "rotary": 0, "heads_last": 0}
    assert [k.attr("is_causal") for k in attention_kernels(fused)] == [1]
    assert_same_outputs(import_onnx(path, batch=2, dims={"seq": 5}, fuse=False), fused)


def _export(module: torch.nn.Module, args: tuple, path, opset: int, names: list[str]):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), args, str(path), opset_version=opset, dynamo=False,
                          input_names=names[:-1], output_names=names[-1:])
    return path


class _SDPA(torch.nn.Module):
    """torch's own F.scaled_dot_product_attention (its exporter scales q and k by sqrt(scale)
    and builds the causal mask with Trilu/Where)."""

    def __init__(self, causal: bool, masked: bool) -> None:
        super().__init__()
        self.causal, self.masked = causal, masked
        self.qkv = torch.nn.Linear(8, 24)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (z.view(b, t, 2, 4).transpose(1, 2) for z in self.qkv(x).split(8, dim=2))
        y = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask if self.masked else None, is_causal=self.causal)
        return y.transpose(1, 2).reshape(b, t, c)


@pytest.mark.parametrize(("causal", "masked", "opset"), [(True, False, 14), (False, True, 17),
                                                         (False, False, 17)])
def test_exported_torch_sdpa_fuses(tmp_path, causal, masked, opset):
    torch.manual_seed(0)
    args = (torch.randn(2, 5, 8), torch.randn(2, 1, 5, 5))
    path = _export(_SDPA(causal, masked), args, tmp_path / "sdpa.onnx", opset, ["x", "m", "y"])
    fused = import_onnx(path)
    (k,) = attention_kernels(fused)
    assert k.attr("is_causal") == int(causal) and len(k.inputs) == 3 + masked
    assert k.attr("scale") == pytest.approx(0.5, rel=1e-6)  # 1 / sqrt(4)
    assert "Softmax" not in ops(fused)
    assert_same_outputs(import_onnx(path, fuse=False), fused)


@pytest.mark.parametrize(("causal", "masked"), [(True, False), (False, True), (False, False)])
def test_dynamo_captured_sdpa_fuses(causal, masked):
    """The dynamo exporter (the Trainer's `capture_module`) writes K^T of a 4-d K as
    Reshape(Transpose(Reshape(K, (B*H, L, E)), (0, 2, 1)), (B, H, E, L)): it fuses as K's
    transpose does, with the heads' transposes (heads-last layout)."""
    from autotm_py.frontend.capture import capture_module
    from autotm_py.frontend.onnx import import_model

    torch.manual_seed(0)
    args = (torch.randn(2, 5, 8), torch.randn(2, 1, 5, 5))
    model = capture_module(_SDPA(causal, masked).eval(), args).model
    fused = import_model(model, name="sdpa", initializer_weights=True)
    (k,) = attention_kernels(fused)
    assert k.attr("is_causal") == int(causal) and len(k.inputs) == 3 + masked
    assert k.attr("scale") == pytest.approx(0.5, rel=1e-6)
    assert k.attr("layout") == BLHE
    assert not {"Softmax", "Transpose", "MatMul"} & set(ops(fused))
    assert_same_outputs(import_model(model, name="sdpa", initializer_weights=True, fuse=False),
                        fused)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("opset", [17, 20])
def test_exported_nn_gelu(tmp_path, opset, approximate):
    """Before opset 20 torch writes GELU out and the pass fuses it; from 20 it writes `Gelu`,
    which imports as that op directly (nothing to fuse)."""
    module = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.GELU(approximate=approximate))
    path = _export(module, (torch.randn(3, 4),), tmp_path / "gelu.onnx", opset, ["x", "y"])
    fused = import_onnx(path)
    assert fused.meta["fusion"]["gelu"] == (1 if opset < 20 else 0)
    assert [k.attr("approximate") for k in fused.kernels if k.op_type == "Gelu"] == [approximate]
    assert_same_outputs(import_onnx(path, fuse=False), fused)


def test_fuse_refuses_a_training_graph():
    from autotm_py.errors import GraphError
    from autotm_py.ir.training import derive_training

    with pytest.raises(GraphError, match="fuse the forward graph"):
        fuse_graph(derive_training(attention_graph()))


@pytest.mark.parametrize(("dtype", "masked", "head", "kv_heads", "want"), [
    (torch.bfloat16, False, 64, 4, "forced"),
    (torch.float16, False, 128, 4, "forced"),
    (torch.float32, False, 64, 4, "efficient"),   # fp32: no half-precision kernel
    (torch.bfloat16, True, 64, 4, "efficient"),   # a mask: the memory-efficient pair takes it
    (torch.bfloat16, False, 160, 4, "efficient"),  # head wider than 128
    (torch.bfloat16, False, 60, 4, "efficient"),  # head not a multiple of 8
    (torch.bfloat16, False, 64, 2, "efficient"),  # fewer key/value heads than query heads
])
def test_cuda_attention_backend_follows_the_operands(monkeypatch, dtype, masked, head, kv_heads,
                                                     want):
    """Which CUDA kernel pair runs an attention (`kernels.fused._cuda_backend`) depends on the
    operands alone, so the forward and its gradient kernel always pick the same one; the
    environment variable forces one of the half-precision pairs, and only for operands they
    take. (The kernels themselves run in tests/test_fuse_gpu.py on the device machine.)"""
    from autotm_py.errors import ConfigError
    from autotm_py.kernels import fused as kernels_fused

    q = torch.zeros(2, 4, 16, head, dtype=dtype)
    kv = torch.zeros(2, kv_heads, 16, head, dtype=dtype)
    mask = torch.zeros(16, 16) if masked else None
    for forced in ("cudnn", "flash", "efficient"):
        monkeypatch.setenv(kernels_fused.SDPA_BACKEND_ENV, forced)
        expected = forced if want == "forced" else want
        assert kernels_fused._cuda_backend(q, kv, kv, mask) == expected
    monkeypatch.setenv(kernels_fused.SDPA_BACKEND_ENV, "fast")
    if want == "forced":
        with pytest.raises(ConfigError, match="AUTOTM_SDPA_BACKEND='fast'"):
            kernels_fused._cuda_backend(q, kv, kv, mask)
