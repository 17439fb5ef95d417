"""The Trainer's host memory on models of billions of parameters: a weight the importer
transposed maps back by its axes, not by an element index (int64 per parameter: a 3.3B
decoder's maps and their tracing took more than the H200 host's 125 GB), and the values an
iteration starts from are made when placed, not held beside the executor's copies."""

from __future__ import annotations

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

from autotm_py.frontend.onnx import import_model
from autotm_py.frontend.weights import initializer_values, weight_derivations
from autotm_py.trainer import Trainer
from autotm_py.trainer.state import Masters, WeightSource


def _twice_transposed() -> onnx.ModelProto:
    """Y = X @ Transpose(Transpose(W, (2, 0, 1)), (0, 2, 1)): W (2, 3, 4) read as (4, 3, 2)."""
    w = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    nodes = [helper.make_node("Transpose", ["W"], ["T1"], perm=[2, 0, 1]),
             helper.make_node("Transpose", ["T1"], ["T2"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["X", "T2"], ["Y"])]
    graph = helper.make_graph(
        nodes, "twice", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4, 5, 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4, 5, 2])],
        [numpy_helper.from_array(w, "W")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_chain_of_transposes_is_one_permutation_of_its_initializer():
    model = _twice_transposed()
    graph = import_model(model, initializer_weights=True)
    derived = {tid: d for tid, d in weight_derivations(model, graph).items() if d is not None}
    assert len(derived) == 1
    (tid, how), = derived.items()
    assert how.initializers == ("W",) and how.perm == (2, 1, 0)
    w = numpy_helper.to_array(model.graph.initializer[0])
    np.testing.assert_array_equal(np.transpose(w, how.perm),
                                  initializer_values(model, graph).values[tid])


def test_a_permuted_weight_goes_to_the_graph_and_back():
    source = WeightSource("w", perm=(2, 0, 1))
    value = torch.arange(24.0).reshape(2, 3, 4)
    graph_value = source.to_graph(value)
    assert torch.equal(graph_value, value.permute(2, 0, 1))
    back = source.to_source(graph_value.contiguous().reshape(-1), torch.empty(2, 3, 4))
    assert torch.equal(back, value)


class _MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)

    def forward(self, x):
        # on tokens (3-D) torch exports a Linear as MatMul(x, Transpose(W)): a weight the
        # importer derives
        return self.fc2(torch.relu(self.fc1(x))).mean(dim=1)


def test_the_trainer_maps_linear_weights_by_axes_and_makes_masters_when_placed(tmp_path):
    torch.manual_seed(0)
    net = _MLP()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    example = (torch.randn(8, 5, 16), torch.randint(0, 4, (8,)))
    trainer = Trainer(net, opt, torch.nn.functional.cross_entropy, example, budget="1MiB",
                      device="cpu", plans_dir=tmp_path)
    matrices = {tid: s for tid, s in trainer.map.weights.items() if s.name.endswith("weight")}
    assert sorted(s.name for s in matrices.values()) == ["fc1.weight", "fc2.weight"]
    assert all(s.perm == (1, 0) and s.index is None for s in matrices.values())
    masters = trainer.loop.executor.masters
    assert isinstance(masters, Masters)
    # only the batch, its labels and the learning rate are held; weights are made on demand
    assert set(masters.given) <= {*trainer.map.inputs, trainer.map.labels, trainer.map.lr}
    tid = next(t for t, s in matrices.items() if s.name == "fc1.weight")
    first, again = masters[tid], masters[tid]
    assert first is not again and torch.equal(first, net.fc1.weight.detach().t())
    trainer.step(*example)
    trainer.sync()
    assert not torch.equal(net.fc1.weight.detach().t(), first)  # trained, written back
