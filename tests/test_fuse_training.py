"""Fused graphs train like the unfused ones: loss, every weight gradient and every updated
weight of the fused training graph (our kernels) against torch.autograd of the *unfused*
graph, over several SGD steps; also against autograd of the fused forward kernels. Memory:
the fused backward saves a logsumexp instead of the score matrix, so BERT's peak drops.
Plans of a fused graph run bitwise like the reference; the cost model prices the fused ops;
`inspect` shows what was fused."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from autotm_py.cli import main
from autotm_py.frontend.fuse import fuse_graph
from autotm_py.frontend.onnx import import_onnx
from autotm_py.frontend.zoo import build_graph
from autotm_py.ir import TensorGraph
from autotm_py.ir.rules.fused import SDPA, SDPA_GRAD
from autotm_py.ir.training import derive_training
from autotm_py.profiling.costmodel import OpShape, flops_of
from autotm_py.runtime.reference import autograd_steps, init_values, train_steps
from tests.test_fuse import FIXTURES, attention_graph, gelu_graph
from tests.test_training_models import tiny_decoder
from tests.test_training_ops import assert_close, compare_training


def _leaf_values(unfused: TensorGraph, values: dict, fused: TensorGraph) -> dict:
    """The fused training graph's leaves, by name from the unfused graph's values."""
    own = init_values(fused)
    return {t.id: values[unfused.by_name(t.name).id]
            if t.name in unfused.tensor_ids_by_name and t.id not in fused.constants
            else own[t.id] for t in fused.tensors if t.producer is None}


def compare_with_unfused(unfused: TensorGraph, fused: TensorGraph, *, steps: int = 3,
                         rtol: float = 1e-4, seed: int = 0,
                         fixed: dict[str, np.ndarray] | None = None,
                         loss_chunks: int = 1) -> None:
    """`steps` SGD steps of the fused training graph (our kernels) against torch.autograd of
    the unfused one: loss, weight gradients and updated weights, matched by name. With
    `loss_chunks`, the fused graph's loss is the chunked LinearCrossEntropy.

    Tolerance: |ours - ref| <= 1e-7 + rtol * max|ref| + 1e-6 * (the step's largest weight
    gradient). The last term is float32 noise: a parameter whose true gradient is exactly 0
    (a key bias: softmax ignores a per-row shift) gets rounding noise of the order of its
    layer's gradients from either side, which no relative tolerance can compare."""
    tu, tf = derive_training(unfused), derive_training(fused, loss_chunks=loss_chunks)
    values = init_values(tu, seed)
    for name, value in (fixed or {}).items():
        values[tu.by_name(name).id] = torch.as_tensor(value)
    fused_grads = dict(tf.meta["training"]["weight_grads"])
    ref = autograd_steps(tu, steps, values=values)
    ours = train_steps(tf, steps, values=_leaf_values(tu, values, tf),
                       keep=list(fused_grads.values()))
    pairs = [(tu.meta["training"]["loss"], tf.meta["training"]["loss"])]
    for w, g in tu.meta["training"]["weight_grads"]:
        wf = tf.by_name(tu.name_of(w)).id
        pairs.append((g, fused_grads[wf]))
        pairs.append((tu.by_name(f"{tu.name_of(w)}::next").id,
                      tf.by_name(f"{tu.name_of(w)}::next").id))
    assert len(pairs) > 3
    for step, (want, got) in enumerate(zip(ref, ours, strict=True)):
        floor = 1e-6 * max(float(want[g].abs().max()) for _, g in
                           tu.meta["training"]["weight_grads"])
        for a, b in pairs:
            assert_close(got[b], want[a], f"step {step}: {tu.name_of(a)}", rtol=rtol,
                         atol=1e-7 + floor)


# ---- numerics -----------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", [{}, {"scale": "qk"}, {"mask": "where-causal"},
                                     {"mask": "where-fill-first"}, {"mask": "add-input"},
                                     {"mask": "where-window"},
                                     {"mask": "where-causal-add-input"}])
def test_fused_attention_trains_like_unfused_autograd(variant):
    graph = attention_graph(**variant)
    fused = fuse_graph(graph)
    assert fused.meta["fusion"]["attention"] == 1
    compare_with_unfused(graph, fused)
    compare_training(fused, steps=2)  # our backward kernel vs autograd of the fused forward


@pytest.mark.parametrize("form", ["erf", "tanh-torch"])
def test_fused_gelu_trains_like_unfused_autograd(form):
    graph = gelu_graph(form)
    compare_with_unfused(graph, fuse_graph(graph))


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_fused_tiny_decoder_trains_like_autograd(optimizer):
    graph = tiny_decoder()
    fused = fuse_graph(graph)
    assert fused.meta["fusion"] == {"attention": 1, "gelu": 1, "linear": 2, "conv_relu": 0,
                                    "rms_norm": 0, "silu": 0, "rotary": 0, "heads_last": 0}
    if optimizer == "sgd":
        compare_with_unfused(graph, fused)
    compare_training(fused, steps=3, optimizer=optimizer)


def test_committed_tiny_gpt_fixture_trains_like_unfused_autograd():
    path = f"{FIXTURES}/tiny_gpt_opset17.onnx"
    dims = {"batch": 2, "seq": 4}
    fused = import_onnx(path, dims=dims)
    compare_with_unfused(import_onnx(path, dims=dims, fuse=False), fused)
    compare_training(fused, steps=3)


ZOO_SEQUENCE_MODELS = ["bert_base", "gpt2_small", "transformer"]


@pytest.mark.parametrize("name", ZOO_SEQUENCE_MODELS)
def test_fused_zoo_builder_trains_like_unfused_autograd(name, monkeypatch):
    """The zoo's own builders at a reduced size (2 layers, d=32, 4 heads, 97 tokens: the same
    blocks and masks), 3 SGD steps of every weight."""
    from autotm_py.frontend.zoo import transformer as builders

    for cfg in (builders.BERT, builders.GPT2, builders.TRANSFORMER):
        for key, value in {"layers": 2, "d": 32, "dff": 64, "heads": 4, "vocab": 97}.items():
            monkeypatch.setitem(cfg, key, value)
    dims = {"seq": 6}
    fused = build_graph(name, batch=2, dims=dims)
    assert fused.meta["fusion"]["attention"] == (6 if name == "transformer" else 2)
    compare_with_unfused(build_graph(name, batch=2, dims=dims, fuse=False), fused)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert_base", "gpt2_small"])
def test_fused_zoo_model_step_matches_unfused_autograd(name):
    """The real 110-124M-parameter models at batch 1, seq 6: one SGD step (loss, every
    gradient, every updated weight). Not compared at full size: further steps (with these
    random weights the losses are 10x ln(vocab) and SGD at lr 0.01 swings them by 100 per
    step, which amplifies float32 rounding, fused or not, past any fixed tolerance), and the
    Transformer, whose sqrt(d)-scaled embeddings saturate the first layers' softmax: the
    unfused SoftmaxGrad of a one-hot row is exactly 0 while the fused backward's
    dP - rowsum(dO * O) leaves float32 cancellation noise (3e-5 of the largest gradient).
    Its fused forward is compared with the unfused one in test_fuse.py, its backward with
    autograd at reduced size above."""
    dims = {"seq": 6}
    compare_with_unfused(build_graph(name, batch=1, dims=dims, fuse=False),
                         build_graph(name, batch=1, dims=dims), steps=1)


# ---- what the backward saves --------------------------------------------------------------------
@pytest.fixture(scope="module")
def bert_b16_s512():
    """BERT-base at the benchmark's shapes, derived (shapes only: nothing runs)."""
    return tuple(derive_training(build_graph("bert_base", batch=16, dims={"seq": 512},
                                             fuse=fuse)) for fuse in (False, True))


def test_fused_bert_saves_no_score_matrix_and_peaks_lower(bert_b16_s512):
    unfused, fused = bert_b16_s512
    scores = (16, 12, 512, 512)
    assert sum(t.shape == scores for t in unfused.tensors) > 12 * 4
    assert not any(t.shape == scores for t in fused.tensors)
    assert fused.peak_live_bytes < 0.7 * unfused.peak_live_bytes  # 7.3 vs 11.5 GiB
    assert fused.max_working_set[0] <= unfused.max_working_set[0]


def test_fused_attention_backward_reads_q_k_v_output_and_logsumexp(bert_b16_s512):
    _, fused = bert_b16_s512
    forward = {k.name: k for k in fused.kernels if k.op_type == SDPA}
    grads = [k for k in fused.kernels if k.op_type == SDPA_GRAD]
    assert len(forward) == len(grads) == 12
    for g in grads:
        f = forward[g.name.rsplit("/", 1)[0]]
        q, key, v = f.inputs
        out, lse = f.outputs
        assert g.inputs[1:] == (q, key, v, out, lse)
        assert fused.tensors[lse].shape == (16, 12, 512)
        assert fused.tensors[lse].dtype == "float32"
        assert g.attr("output_mask") == (1, 1, 1)
        assert g.workspace_bytes == 16 * 12 * 512 * 4  # the row sums of dO * O
    # GELU's backward reads its input only
    gelu_grads = [k for k in fused.kernels if k.op_type == "GeluGrad"]
    assert len(gelu_grads) == 13
    for g in gelu_grads:
        x = g.inputs[1]
        assert fused.kernels[fused.tensors[x].producer].op_type == "Linear"  # with its bias


# ---- executor, cost model, CLI ------------------------------------------------------------------
def test_plans_of_a_fused_graph_match_the_reference_bitwise():
    from autotm_py.runtime.execute import run_steps
    from tests.test_executor import _plans

    graph = derive_training(fuse_graph(tiny_decoder()))
    reference = train_steps(graph, steps=2, seed=3)
    plans = _plans(graph)
    assert sum(1 for _ in plans["all-slow"].moves()) > 10
    for name, plan in plans.items():
        for step, (got, want) in enumerate(zip(run_steps(graph, plan, steps=2, seed=3),
                                               reference, strict=True)):
            for tid in graph.outputs:
                assert torch.equal(got[tid], want[tid]), (name, step, graph.name_of(tid))


def test_cost_model_prices_attention_by_its_flops():
    def shape(op: str, ins: list, outs: list, **attrs) -> OpShape:
        return OpShape(op, "autotm", attrs, tuple((s, "float32") for s in ins),
                       tuple((s, "float32") for s in outs))

    b, h, n, e = 16, 12, 512, 64
    q = (b, h, n, e)
    fwd = shape(SDPA, [q, q, q], [q], scale=0.125, is_causal=0)
    matmuls = 2 * (2.0 * b * h * n * n * e)  # Q K^T and P V
    assert flops_of(fwd) == pytest.approx(matmuls + 5.0 * b * h * n * n)
    causal = shape(SDPA, [q, q, q], [q], scale=0.125, is_causal=1)
    assert flops_of(causal) == pytest.approx(flops_of(fwd) / 2)
    grad = shape(SDPA_GRAD, [q, q, q, q, q, q[:-1]], [q, q, q], scale=0.125, is_causal=0)
    assert flops_of(grad) == pytest.approx(2.5 * matmuls + 8.0 * b * h * n * n)
    # the same attention with (B, L, H, E) operands
    blhe = (b, n, h, e)
    assert flops_of(shape(SDPA, [blhe] * 3, [blhe], scale=0.125, is_causal=0,
                          layout="blhe")) == flops_of(fwd)
    assert flops_of(shape(SDPA_GRAD, [blhe] * 5 + [q[:-1]], [blhe] * 3, scale=0.125,
                          is_causal=0, layout="blhe")) == flops_of(grad)


def test_inspect_shows_what_was_fused(capsys):
    assert main(["inspect", "bert_base", "--batch", "1", "--dim", "seq=8", "--json"]) == 0
    fused = json.loads(capsys.readouterr().out)
    assert fused["fused"] == {"attention": 12, "gelu": 13, "linear": 74, "conv_relu": 0,
                              "rms_norm": 0, "silu": 0, "rotary": 0, "heads_last": 0}
    assert fused["ops"][SDPA] == 12 and "Softmax" not in fused["ops"]
    assert main(["inspect", "bert_base", "--batch", "1", "--dim", "seq=8", "--no-fuse",
                 "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert plain["fused"] is None and plain["ops"]["Softmax"] == 12
    assert main(["inspect", "gpt2_small", "--batch", "1", "--dim", "seq=8"]) == 0
    assert "fused        12 attention, 12 gelu, 49 linear" in capsys.readouterr().out


def test_a_plan_for_the_unfused_graph_names_no_fuse(tmp_path, capsys):
    plan_path = tmp_path / "plan.json"
    assert main(["optimize", "bert_base", "--batch", "1", "--dim", "seq=8", "--no-fuse",
                 "--ratio", "1:0", "--no-baselines", "-o", str(plan_path)]) == 0
    capsys.readouterr()
    assert main(["simulate", "bert_base", "--batch", "1", "--dim", "seq=8", "--no-fuse",
                 "--plan", str(plan_path)]) == 0
    capsys.readouterr()
    # without the flag, simulate takes the plan's model options: the unfused graph
    assert main(["simulate", "bert_base", "--plan", str(plan_path)]) == 0
    capsys.readouterr()
    fused_plan = tmp_path / "fused.json"
    assert main(["optimize", "bert_base", "--batch", "1", "--dim", "seq=8",
                 "--ratio", "1:0", "--no-baselines", "-o", str(fused_plan)]) == 0
    capsys.readouterr()
    assert main(["simulate", "bert_base", "--batch", "1", "--dim", "seq=8", "--no-fuse",
                 "--plan", str(fused_plan)]) != 0
    assert "fuse" in capsys.readouterr().err


def test_lse_dtype_follows_the_inputs():
    graph = attention_graph()
    f64 = derive_training(fuse_graph(graph))
    lse = next(k.outputs[1] for k in f64.kernels if k.op_type == SDPA)
    assert f64.tensors[lse].dtype == "float32" and f64.tensors[lse].shape == (2, 2, 4)
    assert math.isclose(next(k.attr("scale") for k in f64.kernels if k.op_type == SDPA),
                        1 / math.sqrt(3), rel_tol=1e-6)

