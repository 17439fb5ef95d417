"""`--loss-chunks`: a language model's head and softmax cross-entropy as one LinearCrossEntropy
kernel over blocks of rows (`ir/rules/fused.py`). The loss and every gradient match torch
autograd of the plain graph; the graph never holds the logits, so its peak and its smallest
feasible budget drop; plans record the option and rebuild the graph from it; models whose loss
is not over a Linear's last axis are refused in one line. The executor's bitwise tests over
plans of the chunked decoder are in `test_executor.py` ("decoder-chunked")."""

from __future__ import annotations

import json

import pytest
import torch

from autotm_py.cli import main
from autotm_py.errors import ConfigError
from autotm_py.frontend.fuse import fuse_graph
from autotm_py.ir.graph import Role
from autotm_py.ir.training import derive_training
from autotm_py.runtime.reference import autograd_steps, train_steps
from tests.test_fuse_training import compare_with_unfused
from tests.test_training_models import Net, tiny_decoder


def biased_head(batch: int = 3, seq: int = 5, d: int = 6, vocab: int = 13):
    """Hidden states through one Linear with a bias and no transpose (W is d x vocab)."""
    net = Net("biased_head")
    x = net.tensor((batch, seq, d), Role.INPUT, name="x")
    h = net.op("Tanh", [net.op("MatMul", [x, net.weight(d, d)], (batch, seq, d))],
               (batch, seq, d))
    logits = net.op("MatMul", [h, net.weight(d, vocab)], (batch, seq, vocab))
    return net.build(net.op("Add", [logits, net.weight(vocab)], (batch, seq, vocab)))


@pytest.mark.parametrize("chunks", [2, 3, 7, 50])
def test_the_chunked_loss_trains_like_autograd_of_the_plain_loss(chunks):
    """Tied, transposed head without a bias (the decoder), any number of blocks: more blocks
    than rows gives one row per block."""
    graph = tiny_decoder()
    compare_with_unfused(graph, fuse_graph(graph), loss_chunks=chunks)


@pytest.mark.parametrize("chunks", [2, 4])
def test_a_head_with_a_bias_and_no_transpose_trains_like_autograd(chunks):
    graph = biased_head()
    fused = fuse_graph(graph)
    assert [k.op_type for k in fused.kernels][-1] == "Linear"
    compare_with_unfused(graph, fused, loss_chunks=chunks)


def test_the_loss_kernel_replaces_the_head_and_no_logits_remain():
    forward = fuse_graph(tiny_decoder(batch=2, seq=6, vocab=11, d=8))
    plain, chunked = derive_training(forward), derive_training(forward, loss_chunks=3)
    head = next(k for k in chunked.kernels if k.op_type == "LinearCrossEntropy")
    assert head.attr("chunks") == 3 and head.id < chunked.meta["training"]["forward_kernels"]
    assert chunked.meta["training"]["loss_kernel"] == head.id
    assert chunked.meta["training"]["loss_chunks"] == 3
    assert chunked.tensors[head.outputs[0]].name == "loss"
    assert chunked.tensors[head.outputs[1]].shape == (2, 5)  # one logsumexp per row
    # forward ids unchanged: the logits' id is the loss's
    assert head.outputs[0] == forward.outputs[0]
    grad = next(k for k in chunked.kernels if k.op_type == "LinearCrossEntropyGrad")
    rows_per_block = 4  # ceil(2 x 5 rows / 3)
    # 11 classes: too few to pad (a GPU pads 1024 and more to rows of 128 bytes)
    assert head.workspace_bytes == grad.workspace_bytes == rows_per_block * 11 * 4
    assert not any(k.op_type.startswith("SoftmaxCrossEntropy") for k in chunked.kernels)
    assert all(t.shape != (2, 5, 11) for t in chunked.tensors)  # no logits-sized tensor
    assert chunked.peak_live_bytes <= plain.peak_live_bytes  # the peak is elsewhere here
    assert "loss_chunks" not in plain.meta["training"]


def test_a_large_unaligned_vocabulary_pads_its_weight_in_the_workspace():
    """2001 classes (rows of 8004 bytes): the loss's workspace is a block's logits over 2016
    classes (rows of 128 bytes) and the padded weight with its bias; its gradient's adds the
    weight's gradient over the padded classes. 2048 classes are aligned: no padding."""
    for vocab, padded in ((2001, 2016), (2048, 2048)):
        forward = fuse_graph(tiny_decoder(batch=2, seq=9, vocab=vocab, d=16, heads=2))
        chunked = derive_training(forward, loss_chunks=4)
        head = next(k for k in chunked.kernels if k.op_type == "LinearCrossEntropy")
        grad = next(k for k in chunked.kernels if k.op_type == "LinearCrossEntropyGrad")
        weight = (16 + 1) * padded * 4 if padded != vocab else 0
        assert head.workspace_bytes == 4 * padded * 4 + weight  # ceil(2 x 8 rows / 4) = 4
        assert grad.workspace_bytes == head.workspace_bytes + weight


def test_a_large_vocabulary_head_needs_far_less_memory():
    """Logits of 256 rows x 4096 classes (4 MiB each: the logits, their log-probabilities,
    their gradient) against 16 blocks of 256 KiB: the peak and the largest working set drop
    (8.6 -> 1.0 MiB, 8.0 -> 0.8 MiB)."""
    forward = fuse_graph(tiny_decoder(batch=4, seq=65, vocab=4096, d=16, heads=2))
    plain, chunked = derive_training(forward), derive_training(forward, loss_chunks=16)
    assert plain.peak_live_bytes - chunked.peak_live_bytes > 6 * 2**20
    assert chunked.max_working_set[0] < plain.max_working_set[0] / 4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("trans", [True, False])
def test_padded_classes_compute_what_unpadded_ones_do(monkeypatch, dtype, trans):
    """On a GPU the loss's classes are padded with zero weights to rows of 128 bytes (cuBLAS's
    aligned kernels); here the CPU pads them too: the loss, the logsumexp and every gradient,
    with a bias and without, for a tied (transposed) head and another, are those of the
    unpadded classes, and the padded weight has zero classes past the vocabulary."""
    from autotm_py.ir.rules.fused import padded_classes
    from autotm_py.kernels import fused

    gen = torch.Generator().manual_seed(3)
    rows, d, vocab = 37, 24, 2001  # 2001 classes: rows of neither 16 nor 128 bytes
    x = torch.randn(rows, d, generator=gen).to(dtype)
    w = (torch.randn(vocab, d, generator=gen) / 4).to(dtype)
    w = w if trans else w.t().contiguous()
    b = torch.randn(vocab, generator=gen).to(dtype)
    labels = torch.randint(0, vocab, (rows,), generator=gen)
    cases = {"bias": ((x, w, b, labels), (1, 1, 1)), "none": ((x, w, labels), (1, 1, 0))}

    def run(args, mask):
        loss, lse = fused._ce_forward(args, trans, 4)
        return [loss, lse, *fused._ce_backward((*args, lse), trans, 4, mask)]

    plain = {name: run(*case) for name, case in cases.items()}
    monkeypatch.setattr(fused, "PADDED_DEVICES", ("cpu",))
    head = fused._Head(w.t() if trans else w, b)
    width = padded_classes(vocab, x.element_size())
    assert head.padded and head.w.shape == (d, width) and width * x.element_size() % 128 == 0
    assert not head.w[:, vocab:].any() and not head.bias[vocab:].any()
    assert torch.equal(head.w[:, :vocab], w.t() if trans else w)
    tolerance = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else \
        {"rtol": 1e-2, "atol": 1e-3}
    for name, case in cases.items():
        for got, want in zip(run(*case), plain[name], strict=True):
            assert got.dtype == want.dtype and got.shape == want.shape, name
            torch.testing.assert_close(got, want, **tolerance)


def test_two_runs_of_the_chunked_loss_are_bitwise_equal():
    train = derive_training(fuse_graph(tiny_decoder()), loss_chunks=3)
    first, second = train_steps(train, steps=2, seed=4), train_steps(train, steps=2, seed=4)
    for a, b in zip(first, second, strict=True):
        assert all(torch.equal(a[t], b[t]) for t in a)


def test_autograd_runs_the_chunked_loss_without_saving_logits():
    """The eager baselines run the forward kernels under autograd: the kernel's autograd form
    gives our gradients (bitwise: its backward is the gradient kernel)."""
    train = derive_training(fuse_graph(tiny_decoder()), loss_chunks=4)
    grads = [g for _, g in train.meta["training"]["weight_grads"]]
    ours = train_steps(train, steps=2, seed=2, keep=grads)
    ref = autograd_steps(train, steps=2, seed=2)
    loss = train.meta["training"]["loss"]
    for a, b in zip(ours, ref, strict=True):
        assert torch.equal(a[loss], b[loss])
        for g in grads:
            assert torch.allclose(a[g], b[g], rtol=1e-6, atol=1e-7)


def capped_head():
    """Logits soft-capped by a Tanh after the head: no head makes the output. (A CNN's Gemm
    classifier is a head: `test_lm_heads.py`.)"""
    net = Net("capped_head")
    x = net.tensor((2, 3, 6), Role.INPUT, name="x")
    logits = net.op("MatMul", [x, net.weight(6, 9)], (2, 3, 9))
    return net.build(net.op("Tanh", [logits], (2, 3, 9)))


@pytest.mark.parametrize("forward, why", [
    (capped_head, "made by Tanh .*, not by a fused Linear layer"),
    (lambda: tiny_decoder(), "not by a fused Linear layer"),  # unfused: a MatMul makes it
])
def test_a_loss_that_is_no_linear_head_is_refused(forward, why):
    with pytest.raises(ConfigError, match=why) as err:
        derive_training(forward(), loss_chunks=4)
    assert "--loss-chunks 1" in str(err.value)


def test_mse_and_bad_counts_are_refused():
    forward = fuse_graph(tiny_decoder())
    with pytest.raises(ConfigError, match="not a softmax cross-entropy"):
        derive_training(forward, loss="mse", loss_chunks=2)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ConfigError, match="positive integer"):
            derive_training(forward, loss_chunks=bad)


def test_optimize_records_the_option_and_simulate_rebuilds_the_graph(tmp_path, capsys):
    """The plan's header keeps loss_chunks; `simulate` rebuilds the chunked graph from it
    without being told, and refuses the plan for the plain graph."""
    plan = tmp_path / "plan.json"
    assert main(["optimize", "gpt2_small", "--training", "--batch", "1", "--dim", "seq=64",
                 "--device", "cuda", "--solver", "highs", "--loss-chunks", "8", "--fast-mem",
                 "2GiB", "--strategy", "static", "-o", str(plan)]) == 0
    header = json.loads(plan.read_text())["header"]
    assert header["model"]["loss_chunks"] == 8
    assert main(["simulate", "gpt2_small", "--plan", str(plan)]) == 0
    capsys.readouterr()
    assert main(["simulate", "gpt2_small", "--plan", str(plan), "--loss-chunks", "1"]) != 0
    err = capsys.readouterr().err
    assert "loss_chunks" in err and "Traceback" not in err


def test_the_cli_refuses_a_bad_count_in_one_line(capsys):
    assert main(["inspect", "gpt2_small", "--training", "--batch", "1", "--dim", "seq=64",
                 "--loss-chunks", "0"]) != 0
    captured = capsys.readouterr()
    assert "--loss-chunks" in captured.err and "Traceback" not in captured.err


def test_inspect_shows_the_smaller_peak_and_working_set(capsys):
    """GPT-2 small b2 s1024: logits of 393 MiB. Measured here: peak 2502 -> 1890 MiB, largest
    working set 785 -> 442 MiB (now the tied embedding's gradient sum, not the loss)."""
    args = ["inspect", "gpt2_small", "--training", "--batch", "2", "--dim", "seq=1024", "--json"]
    assert main(args) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main([*args, "--loss-chunks", "16"]) == 0
    chunked = json.loads(capsys.readouterr().out)
    assert chunked["max_working_set_bytes"] < 0.6 * plain["max_working_set_bytes"]
    assert plain["peak_live_bytes"] - chunked["peak_live_bytes"] > 500 * 2**20


def test_bench_names_the_chunked_loss_in_its_rows_and_plans():
    from autotm_py.bench.spec import BenchSpec
    from autotm_py.options import ModelOptions, RunMode

    spec = BenchSpec(models=("gpt2_small",), ratios=("1:1",), strategies=("async",),
                     device="cuda", model=ModelOptions(training=True, loss_chunks=16),
                     run=RunMode(arena=True, replay=True), plans_dir="plans")
    assert spec.options is not None and spec.options.endswith("+loss16")
    assert "loss16" in str(spec.plan_path("gpt2_small", "1:1", "async", "highs"))
    with pytest.raises(ConfigError, match="--loss-chunks"):
        BenchSpec(models=("gpt2_small",), ratios=("1:1",), model=ModelOptions(loss_chunks=0))


def test_an_infeasible_budget_set_by_the_logits_points_to_the_option():
    """GPT-2 small b2 s1024 at 10%: the plain loss's gradient forces the smallest budget, and
    the message says --loss-chunks; the chunked graph's message does not."""
    from autotm_py import api
    from autotm_py.config import PlanConfig
    from autotm_py.units import parse_ratio

    config = PlanConfig(ratio=parse_ratio("1:9"), device="cuda")
    for chunks, hinted in ((1, True), (16, False)):
        graph = api.load_model("gpt2_small", batch=2, dims={"seq": 1024}, training=True,
                               loss_chunks=chunks)
        result = api.optimize(graph, config)
        assert result.status == "infeasible", result.message
        assert ("--loss-chunks 16" in result.message) == hinted, result.message


def test_inspect_says_when_the_logits_set_the_largest_working_set(capsys):
    # fp32: in bf16 (the GPU default) the logits are half the bytes and the tied embedding's
    # fp32 gradient cast sets the largest working set
    args = ["inspect", "gpt2_small", "--training", "--batch", "2", "--dim", "seq=1024",
            "--precision", "fp32"]
    assert main(args) == 0
    assert "set by the loss's logits (392.63 MiB): --loss-chunks 16" in capsys.readouterr().out
    assert main([*args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["max_working_set_logits_bytes"] == \
        2 * 1024 * 50257 * 4
    assert main([*args, "--loss-chunks", "16"]) == 0
    assert "set by the loss's logits" not in capsys.readouterr().out
    assert main(["inspect", "resnet50", "--training", "--batch", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["max_working_set_logits_bytes"] is None


def test_no_hint_where_chunking_would_be_refused():
    """Logits that another kernel also reads cannot be chunked, so no message points to
    --loss-chunks there."""
    from autotm_py.ir.training import chunkable_logits_bytes

    net = Net("head_read_twice")
    x = net.tensor((2, 8, 6), Role.INPUT, name="x")
    logits = net.op("MatMul", [x, net.weight(6, 64)], (2, 8, 64))
    logits = net.op("Add", [logits, net.weight(64)], (2, 8, 64))
    net.op("Relu", [logits], (2, 8, 64))
    forward = fuse_graph(net.build(logits))
    with pytest.raises(ConfigError, match="other kernels read the output"):
        derive_training(forward, loss_chunks=2)
    plain = derive_training(forward)
    grad = next(k for k in plain.kernels if k.op_type == "SoftmaxCrossEntropyGrad")
    assert chunkable_logits_bytes(plain, grad.id) is None
    single = derive_training(fuse_graph(biased_head()))
    grad = next(k for k in single.kernels if k.op_type == "SoftmaxCrossEntropyGrad")
    assert chunkable_logits_bytes(single, grad.id) == 3 * 5 * 13 * 4
