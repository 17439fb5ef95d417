"""The zoo models train: every model derives (both optimizers) into a valid training graph
whose ops all have torch kernels, and two of them (a BN CNN and a GPT decoder) match
torch.autograd over 3 SGD steps at batch 1.

The numeric check runs the real 224x224 / 124M-parameter models, tens of seconds each on two
cores, so it covers ResNet-50 and GPT-2 small and is marked slow. docs/training.md lists the
other models' results (checked by hand, in float64 where float32 rounding is amplified by
depth)."""

from __future__ import annotations

import pytest

from autotm_py.frontend.zoo import ZOO, build_graph
from autotm_py.ir.graph import Role, TensorGraph
from autotm_py.ir.training import derive_training
from autotm_py.kernels import SUPPORTED_KERNELS
from tests.test_training_ops import compare_training


def _zoo_graph(name: str) -> TensorGraph:
    dims = {"seq": 8} if ZOO[name].is_sequence else None
    return build_graph(name, batch=1, dims=dims)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_model_derives_training(name: str) -> None:
    graph = _zoo_graph(name)
    frozen = {k.inputs[i] for k in graph.kernels if k.op_type == "BatchNormalization"
              for i in (3, 4)}
    weights = {t.id for t in graph.tensors if t.role == Role.WEIGHT} - frozen
    for optimizer in ("sgd", "adam"):
        train = derive_training(graph, optimizer=optimizer)
        assert {k.op_type for k in train.kernels} <= SUPPORTED_KERNELS
        assert set(dict(train.meta["training"]["weight_grads"])) == weights
        updates = [k for k in train.kernels if k.op_type in ("SGDUpdate", "AdamUpdate")]
        assert {k.inputs[0] for k in updates} == weights
        assert [k.op_type for k in train.kernels[: len(graph.kernels)]] == [
            k.op_type for k in graph.kernels]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet50", "gpt2_small"])
def test_zoo_model_trains_like_autograd(name: str) -> None:
    compare_training(_zoo_graph(name), steps=3)
