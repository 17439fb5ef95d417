"""The eager torch baselines on the CPU: checkpointed segments of any imported graph compute
what plain autograd computes, and the cuts sit where few bytes cross."""

from __future__ import annotations

import itertools

import pytest
import torch

from autotm_py import api
from autotm_py.errors import ConfigError
from autotm_py.runtime import eager
from autotm_py.runtime.reference import init_values
from autotm_py.runtime.segments import crossing_bytes, cut_points, forward_segments

FIXTURE = "tests/fixtures/tiny_cnn_opset13.onnx"


def _graph():
    return api.load_model(FIXTURE, batch=2, training=True)


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_segments_cover_the_forward_kernels_and_read_only_what_exists(n):
    graph = _graph()
    meta = graph.meta["training"]
    parts = forward_segments(graph, meta["forward_kernels"], n, keep=(meta["loss"],))
    assert parts[0].start == 0 and parts[-1].stop == meta["forward_kernels"]
    assert all(a.stop == b.start for a, b in itertools.pairwise(parts))
    assert len(parts) == min(n, meta["forward_kernels"])
    available = {t.id for t in graph.tensors if t.producer is None}
    for seg in parts:
        assert set(seg.inputs) <= available, "a segment reads a tensor nobody gave it"
        available |= set(seg.outputs)
    assert meta["loss"] in parts[-1].outputs


def test_cuts_move_to_where_fewest_bytes_cross():
    graph = api.load_model("resnet50", batch=1, training=True)
    n_forward = graph.meta["training"]["forward_kernels"]
    cost = crossing_bytes(graph, n_forward)
    cuts = cut_points(graph, n_forward, 2)
    target = round(n_forward / 2)
    slack = int(n_forward / 2 / 4)
    window = range(max(1, target - slack), min(n_forward - 1, target + slack) + 1)
    assert cost[cuts[1]] == min(cost[c] for c in window)


def _gradients(graph, segments):
    meta = graph.meta["training"]
    values = init_values(graph, seed=3)
    params = {w: values[w].clone().requires_grad_(True) for w, _ in meta["weight_grads"]}
    env = {**values, **params}
    parts = forward_segments(graph, meta["forward_kernels"], segments, keep=(meta["loss"],))
    eager._forward(graph, parts, env)
    env[meta["loss"]].backward()
    return {w: p.grad for w, p in params.items()}


def test_checkpointed_gradients_equal_plain_autograd():
    graph = _graph()
    plain = _gradients(graph, 1)
    for n in (2, 4):
        checked = _gradients(graph, n)
        assert checked.keys() == plain.keys()
        for w, grad in plain.items():
            assert torch.equal(checked[w], grad), f"gradient of tensor #{w} differs with {n}"


def test_measure_autograd_names_the_variant():
    graph = _graph()
    run = eager.measure_autograd(graph, device="cpu", iterations=1, warmup=0, segments=3)
    assert run.strategy == "torch-checkpoint-3" and run.median_s > 0
    assert eager.measure_autograd(graph, device="cpu", iterations=1, warmup=0).strategy == \
        "torch-autograd"
    found = eager.fit_checkpointing(graph, 1 << 30, device="cpu", iterations=1, warmup=0)
    assert found is not None and found.notes[-1] == "1 checkpointed segments"


def test_inference_graph_is_refused():
    with pytest.raises(ConfigError, match="--training"):
        eager.measure_autograd(api.load_model(FIXTURE, batch=2), device="cpu")
