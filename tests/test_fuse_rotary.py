"""The rotary-embedding fusion (`frontend/fuse_rotary.py`): transformers' `q * cos +
rotate_half(q) * sin` becomes one `RotaryEmbedding` kernel (three launches) whose backward is
one `RotaryEmbeddingGrad` (three launches), computing and training like the unfused graph and
torch.autograd; a cos or sin that needs a gradient, or an intermediate read elsewhere, keeps
the pattern unfused. Covered: hand-built graphs in every operand order, a hand-written torch
module and the small transformers Llama captured by the dynamo exporter (the Trainer's path),
and the corpus Llama."""

from __future__ import annotations

import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from autotm_py import api
from autotm_py.frontend import fuse
from autotm_py.frontend.capture import capture_module
from autotm_py.frontend.fuse import fuse_graph
from autotm_py.frontend.onnx import import_model
from autotm_py.ir import Role, TensorGraph
from autotm_py.ir.graph import Kernel, freeze_attrs
from autotm_py.ir.rules.fused import ROTARY, ROTARY_GRAD
from autotm_py.ir.training import derive_training
from autotm_py.kernels import run_kernel, run_kernel_into
from autotm_py.memory.scratch import writes_in_place
from autotm_py.profiling.costmodel import H100_SXM, OpShape, flops_of, numel
from tests.fixtures.checks import assert_canonical
from tests.test_fuse import assert_same_outputs, ops
from tests.test_fuse_training import compare_with_unfused
from tests.test_kernel_dispatch import dispatched
from tests.test_training_models import Net
from tests.test_training_ops import compare_training

LLAMA = Path(__file__).resolve().parent.parent / "models" / "corpus" / "llama_gqa.onnx"
B, H, S, D = 2, 3, 5, 8
ROTARY_OPS = {"Neg", "Concat", "Slice"}


def cos_sin(s: int = S, d: int = D, lead: tuple[int, ...] = (1, 1)) -> tuple[np.ndarray, ...]:
    """transformers' tables: cat(f, f) of the angles position * inv_freq, cos and sin."""
    inv = 1.0 / 10000 ** (np.arange(0, d, 2, dtype=np.float64) / d)
    f = np.outer(np.arange(s, dtype=np.float64), inv)
    emb = np.concatenate([f, f], axis=-1)
    # per batch row (positions that differ between sequences): shifted angles
    emb = np.stack([emb + i for i in range(int(np.prod(lead)))]).reshape(*lead, s, d)
    return np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)


def reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., h:], x[..., :h]), dim=-1) * sin


# ---- hand-built -------------------------------------------------------------------------------
def rotary_graph(*, cos_first: bool = False, sin_first: bool = False, sum_first: bool = False,
                 table: str = "constant", lead: tuple[int, ...] = (1, 1), leak: str = "",
                 swap: bool = False, slice_axes: str = "last") -> TensorGraph:
    """x -> MatMul -> (B, H, S, D) -> rotary as transformers exports it -> MatMul -> out.

    `table`: COS and SIN as "constant"s, graph "input"s, a trainable "weight" (cos), or
    "from-weight" (cos = Mul(constant, a weight): it needs a gradient); `lead`: the tables'
    leading axes; `leak`: an intermediate that is also a graph output; `swap`: rotate the
    wrong way (cat(-x[:h], x[h:]): no rotate_half); `slice_axes` "all": the Slices name every
    axis (whole ranges but the last)."""
    net = Net("rotary")
    shape = (B, H, S, D)
    x = net.op("MatMul", [net.tensor(shape, Role.INPUT, name="x"), net.weight(D, D)], shape)
    cv, sv = cos_sin(lead=lead)
    if table == "input":
        cos = net.tensor(cv.shape, Role.INPUT, name="cos")
        sin = net.tensor(sv.shape, Role.INPUT, name="sin")
    elif table == "weight":
        cos = net.tensor(cv.shape, Role.WEIGHT, name="cos_w")
        sin = net.b.add_constant("sin", sv)
    else:
        cos, sin = net.b.add_constant("cos", cv), net.b.add_constant("sin", sv)
    if table == "from-weight":
        cos = net.op("Mul", [cos, net.weight(*cv.shape)], cv.shape)
    h = D // 2

    def sl(lo: int, hi: int) -> int:
        if slice_axes == "all":
            return net.op("Slice", [x], (B, H, S, h), starts=(0, 0, 0, lo),
                          ends=(B, H, S, hi), axes=(0, 1, 2, 3), steps=(1, 1, 1, 1))
        return net.op("Slice", [x], (B, H, S, h), starts=(lo,), ends=(hi,), axes=(3,),
                      steps=(1,))

    low, high = sl(0, h), sl(h, D)
    neg = net.op("Neg", [low if swap else high], (B, H, S, h))
    cat = net.op("Concat", [neg, high if swap else low], shape, axis=3)
    a = net.op("Mul", [cos, x] if cos_first else [x, cos], shape)
    b = net.op("Mul", [sin, cat] if sin_first else [cat, sin], shape)
    y = net.op("Add", [b, a] if sum_first else [a, b], shape)
    out = net.op("MatMul", [y, net.weight(D, D)], shape)
    if leak:
        net.b.outputs.append({"low": low, "neg": neg, "cat": cat, "cos-product": a,
                              "sin-product": b}[leak])
    return net.build(out)


ORDERS = {"plain": {}, "cos-first": {"cos_first": True}, "sin-first": {"sin_first": True},
          "sum-first": {"sum_first": True},
          "all-swapped": {"cos_first": True, "sin_first": True, "sum_first": True},
          "tables-2d": {"lead": ()}, "tables-per-batch": {"lead": (B, 1)},
          "tables-as-inputs": {"table": "input"}, "slices-name-every-axis": {"slice_axes": "all"}}


@pytest.mark.parametrize("variant", sorted(ORDERS))
def test_rotary_forms_fuse_compute_and_train_the_same(variant):
    graph = rotary_graph(**ORDERS[variant])
    fused = fuse_graph(graph)
    assert fused.meta["fusion"]["rotary"] == 1
    assert_canonical(fused)
    assert ops(fused) == Counter({"MatMul": 2, ROTARY: 1})
    (k,) = [k for k in fused.kernels if k.op_type == ROTARY]
    assert k.domain == "autotm"
    assert [fused.name_of(t) for t in k.inputs[1:]] == ["cos", "sin"]
    assert_same_outputs(graph, fused)
    compare_with_unfused(graph, fused)  # torch.autograd of the unfused graph
    train = compare_training(fused)  # ours against autograd of the fused forward
    got = ops(train)
    assert got[ROTARY_GRAD] == 1 and not ROTARY_OPS & set(got)
    assert not {"ConcatGrad", "SliceGrad", "SumToShape", "MulGrad"} & set(got)
    (grad,) = [k for k in train.kernels if k.op_type == ROTARY_GRAD]
    assert [train.name_of(t) for t in grad.inputs[1:]] == ["cos", "sin"]


@pytest.mark.parametrize("variant", [{"table": "weight"}, {"table": "from-weight"},
                                     {"leak": "low"}, {"leak": "neg"}, {"leak": "cat"},
                                     {"leak": "cos-product"}, {"leak": "sin-product"},
                                     {"swap": True}],
                         ids=["cos-a-weight", "cos-from-a-weight", "half-read-elsewhere",
                              "negation-read-elsewhere", "rotated-read-elsewhere",
                              "cos-product-read-elsewhere", "sin-product-read-elsewhere",
                              "not-rotate-half"])
def test_rotary_near_misses_stay_unfused(variant):
    graph = rotary_graph(**variant)
    fused = fuse_graph(graph)
    assert fused.meta["fusion"]["rotary"] == 0
    assert ops(fused) == ops(graph)


def _odd_slices() -> TensorGraph:
    """x[..., :3] and x[..., 3:] of D = 8: not the halves."""
    net = Net("odd")
    shape = (B, S, D)
    x = net.tensor(shape, Role.INPUT, name="x")
    low = net.op("Slice", [x], (B, S, 3), starts=(0,), ends=(3,), axes=(2,), steps=(1,))
    high = net.op("Slice", [x], (B, S, 5), starts=(3,), ends=(8,), axes=(2,), steps=(1,))
    cat = net.op("Concat", [net.op("Neg", [high], (B, S, 5)), low], shape, axis=2)
    cv, sv = cos_sin(lead=())
    a = net.op("Mul", [x, net.b.add_constant("cos", cv)], shape)
    b = net.op("Mul", [cat, net.b.add_constant("sin", sv)], shape)
    return net.build(net.op("Add", [a, b], shape))


def test_slices_that_are_not_the_halves_stay_unfused():
    graph = _odd_slices()
    assert fuse_graph(graph).meta["fusion"]["rotary"] == 0


# ---- the kernels --------------------------------------------------------------------------------
def _kernel(op: str, n_in: int = 3) -> Kernel:
    return Kernel(0, op, op, "autotm", freeze_attrs({}), tuple(range(n_in)), (n_in,), "")


@pytest.mark.parametrize("lead", [(1, 1), (), (B, 1), (B, H)], ids=str)
def test_the_kernels_are_the_rotation_and_its_transpose(lead):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(B, H, S, D, generator=gen, dtype=torch.float64, requires_grad=True)
    cos, sin = (torch.randn(*lead, S, D, generator=gen, dtype=torch.float64) for _ in range(2))
    want = reference(x, cos, sin)
    with torch.no_grad():
        (y,) = run_kernel(_kernel(ROTARY), [x.detach(), cos, sin])
    torch.testing.assert_close(y, want.detach(), rtol=1e-12, atol=1e-12)
    dy = torch.randn(B, H, S, D, generator=gen, dtype=torch.float64)
    (dx,) = torch.autograd.grad(want, x, dy)
    (got,) = run_kernel(_kernel(ROTARY_GRAD), [dy, cos, sin])
    torch.testing.assert_close(got, dx, rtol=1e-12, atol=1e-12)
    # under autograd the forward is a Function whose backward is the gradient kernel
    y2 = run_kernel(_kernel(ROTARY), [x, cos, sin])[0]
    (dx2,) = torch.autograd.grad(y2, x, dy)
    torch.testing.assert_close(dx2, dx, rtol=1e-12, atol=1e-12)
    # a cos that requires grad gets one (the composite form)
    c = cos.clone().requires_grad_(True)
    (dc,) = torch.autograd.grad(run_kernel(_kernel(ROTARY), [x, c, sin])[0], c, dy)
    (dc_want,) = torch.autograd.grad(reference(x, c, sin), c, dy)
    torch.testing.assert_close(dc, dc_want)


def test_each_kernel_is_three_launches_and_writes_into_its_slot():
    x, dy = torch.randn(B, H, S, D), torch.randn(B, H, S, D)
    cos, sin = (torch.from_numpy(t) for t in cos_sin())
    three = Counter({"mul": 1, "addcmul_": 2})
    assert dispatched(ROTARY, [x, cos, sin]) == three
    assert dispatched(ROTARY_GRAD, [dy, cos, sin]) == three
    for op, a in ((ROTARY, x), (ROTARY_GRAD, dy)):
        (want,) = run_kernel(_kernel(op), [a, cos, sin])
        out = torch.full_like(a, float("nan"))
        assert run_kernel_into(_kernel(op), [a, cos, sin], [out])
        assert torch.equal(out, want)
        assert not run_kernel_into(_kernel(op), [a.double(), cos, sin], [out])  # mixed dtypes
    train = derive_training(fuse_graph(rotary_graph()))
    for k in train.kernels:
        if k.op_type in (ROTARY, ROTARY_GRAD):
            assert writes_in_place(train, k)


def test_the_cost_model_prices_the_fused_op_below_the_unfused_chain():
    def shape(op: str, ins: list, outs: list) -> OpShape:
        return OpShape(op, "autotm", {}, tuple((s, "float32") for s in ins),
                       tuple((s, "float32") for s in outs))

    x, half, table = (4, 32, 1024, 64), (4, 32, 1024, 32), (1, 1, 1024, 64)
    fwd = shape(ROTARY, [x, table, table], [x])
    bwd = shape(ROTARY_GRAD, [x, table, table], [x])
    for s in (fwd, bwd):
        assert flops_of(s) >= 3 * numel(x)
    chain = [shape("Mul", [x, table], [x]), shape("Neg", [half], [half]),
             shape("Concat", [half, half], [x]), shape("Mul", [x, table], [x]),
             shape("Add", [x, x], [x])]
    assert H100_SXM.time_s(fwd) < sum(H100_SXM.time_s(s) for s in chain)
    grads = [shape("MulGrad", [x, table], [x]), shape("SumToShape", [half], [half]),
             shape("SliceGrad", [half], [x]), shape("SliceGrad", [half], [x]),
             shape("GradAccumulate", [x, x], [x]), shape("MulGrad", [x, table], [x]),
             shape("GradAccumulate", [x, x], [x])]
    assert H100_SXM.time_s(bwd) < sum(H100_SXM.time_s(s) for s in grads)


# ---- exported models ---------------------------------------------------------------------------
def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class RotaryAttention(nn.Module):
    """One attention block with transformers' rotary embedding written out (cos and sin
    computed from the positions in the forward, as LlamaRotaryEmbedding does); `trained_cos`:
    cos a parameter instead (it needs a gradient: no fusion)."""

    def __init__(self, dim: int = 32, heads: int = 2, trained_cos: bool = False) -> None:
        super().__init__()
        self.heads, self.head = heads, dim // heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.cos = nn.Parameter(torch.rand(8, self.head)) if trained_cos else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        inv = 1.0 / (10000 ** (torch.arange(0, self.head, 2, dtype=torch.float32) / self.head))
        f = torch.outer(torch.arange(s, dtype=torch.float32), inv)
        emb = torch.cat((f, f), dim=-1)
        cos = emb.cos()[None, None] if self.cos is None else self.cos
        sin = emb.sin()[None, None]
        q, k, v = (p(x).view(b, s, self.heads, self.head).transpose(1, 2)
                   for p in (self.q, self.k, self.v))
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(o.transpose(1, 2).reshape(b, s, -1))


def _capture(module: nn.Module, *inputs: torch.Tensor) -> onnx.ModelProto:
    """The module as the Trainer captures it (the dynamo exporter, `frontend/capture.py`)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return capture_module(module, inputs).model


def _imports(model: onnx.ModelProto) -> tuple[TensorGraph, TensorGraph]:
    """(unfused, fused) imports, as the Trainer imports a capture."""
    return (import_model(model, initializer_weights=True, fuse=False),
            import_model(model, initializer_weights=True))


def _captured(module: nn.Module, *inputs: torch.Tensor) -> tuple[TensorGraph, TensorGraph]:
    return _imports(_capture(module, *inputs))


def test_a_hand_written_rotary_module_fuses_and_trains_like_autograd():
    torch.manual_seed(0)
    unfused, fused = _captured(RotaryAttention(), torch.randn(2, 8, 32))
    assert fused.meta["fusion"]["rotary"] == 2
    got = ops(fused)
    assert got[ROTARY] == 2 and not {"Neg", "Concat"} & set(got)
    assert_same_outputs(unfused, fused)
    compare_with_unfused(unfused, fused, steps=2)


def test_a_cos_that_trains_keeps_the_module_unfused():
    torch.manual_seed(0)
    _, fused = _captured(RotaryAttention(trained_cos=True), torch.randn(2, 8, 32))
    assert fused.meta["fusion"]["rotary"] == 0
    assert ops(fused)["Neg"] == 2


def _small_llama(layers: int = 2) -> nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=64, num_hidden_layers=layers,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=128, max_position_embeddings=256,
                                   tie_word_embeddings=False, attention_dropout=0.0,
                                   attn_implementation="sdpa")
    net = transformers.LlamaForCausalLM(cfg)
    net.config.use_cache = False

    class Logits(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.net(input_ids=ids).logits

    return Logits()


def _without_rotary(monkeypatch, model) -> TensorGraph:
    """The import with every fusion but this one."""
    find = fuse.find_rewrites
    with monkeypatch.context() as patch:
        patch.setattr(fuse, "find_rewrites",
                      lambda g, *round_: [r for r in find(g, *round_) if r.kind != "rotary"])
        return import_model(model, initializer_weights=True)


def test_the_transformers_llama_fuses_every_rotary_and_trains_like_autograd(monkeypatch):
    layers = 2
    module = _small_llama(layers)
    ids = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(1))
    model = _capture(module, ids)
    unfused, fused = _imports(model)
    assert fused.meta["fusion"]["rotary"] == 2 * layers  # q and k of every layer
    got = ops(fused)
    assert got[ROTARY] == 2 * layers and not {"Neg", "Concat"} & set(got)
    assert_same_outputs(unfused, fused)
    compare_with_unfused(unfused, fused, steps=2)
    train, before = derive_training(fused), derive_training(_without_rotary(monkeypatch, model))
    assert ops(train)[ROTARY_GRAD] == 2 * layers
    assert not {"ConcatGrad", "SliceGrad"} & set(ops(train))
    # per q or k: Slice x2, Neg, Concat, Mul x2, Add forward; MulGrad x2, ConcatGrad, SumToShape,
    # SliceGrad x2, GradAccumulate x2 backward: 15 kernels became 2; and with the rotary fused,
    # the heads-last layout (fuse_heads) drops each layer's 4 head Transposes and their grads
    assert fused.meta["fusion"]["heads_last"] == layers
    assert len(before.kernels) - len(train.kernels) == 2 * layers * 13 + layers * 8


def test_the_corpus_llama_fuses_every_rotary():
    fused = api.import_onnx(LLAMA)
    unfused = api.import_onnx(LLAMA, fuse=False)
    layers = sum(1 for k in fused.kernels if k.op_type == "ScaledDotProductAttention")
    assert layers == 2 and fused.meta["fusion"]["rotary"] == 2 * layers
    got = ops(fused)
    assert got[ROTARY] == 2 * layers and not {"Neg", "Concat"} & set(got)
    assert ops(derive_training(fused))[ROTARY_GRAD] == 2 * layers
    assert_same_outputs(unfused, fused)
