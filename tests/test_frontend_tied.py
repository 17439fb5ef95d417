"""Tied weights stay one tensor: folding a Transpose of a shared embedding must not untie it."""

import pytest

from autotm_py.frontend.zoo import build_graph
from autotm_py.ir import Role


@pytest.mark.parametrize("name", ["gpt2_small", "bert_base"])
def test_tied_embedding_is_one_weight(name):
    graph = build_graph(name, batch=1, dims={"seq": 8})
    weights = sum(t.numel for t in graph.tensors if t.role == Role.WEIGHT)
    assert weights == _zoo_count(name)  # gpt2_small: 124,439,808 with tied embeddings


def _zoo_count(name):
    from autotm_py.frontend.zoo import build_model, count_params

    return count_params(build_model(name, batch=1, seq_len=8))
