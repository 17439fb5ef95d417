"""Recurrent layers import and train (issue 45 item 7): ONNX `LSTM` and `GRU` as torch exports
`nn.LSTM`/`nn.GRU` (one or two layers, batch-first or not, bidirectional), their forward
against the torch module and onnxruntime, their backward against torch.autograd, a plan with
moves, the Trainer; and constant folding of T5's relative-position buckets without NumPy
warnings."""

from __future__ import annotations

import copy
import io
import math
import warnings
from dataclasses import replace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator
from torch import nn

from autotm_py import pipeline as pipeline_module
from autotm_py import workload as workload_module
from autotm_py.config import PlanConfig
from autotm_py.errors import ConfigError, UnsupportedOpError
from autotm_py.frontend.capture import capture_module
from autotm_py.frontend.onnx import import_model
from autotm_py.frontend.weights import initializer_values
from autotm_py.ir.conv_split import (
    CHUNKS_ATTR,
    chunked_name,
    chunked_time_factor,
    part_origins,
    recurrent_chunks,
    split_conv_grads,
    split_names,
    split_variants,
    splittable_kernels,
)
from autotm_py.ir.graph import Role
from autotm_py.ir.training import derive_training
from autotm_py.options import RunMode
from autotm_py.pipeline import optimize
from autotm_py.plan import Plan
from autotm_py.planning.feasibility import smallest_budget
from autotm_py.runtime.execute import run_steps
from autotm_py.runtime.reference import autograd_steps, run_graph, train_steps
from autotm_py.trainer import Trainer
from tests.graphs import costs_for

RTOL = 1e-5
LR = 0.05


class RNNNet(nn.Module):
    """A recurrent layer and a Linear head on the last step or on every step."""

    def __init__(self, kind: str, layers: int, batch_first: bool, head: str,
                 bidirectional: bool = False, features: int = 4, hidden: int = 6) -> None:
        super().__init__()
        self.rnn = getattr(nn, kind)(features, hidden, num_layers=layers,
                                     batch_first=batch_first, bidirectional=bidirectional)
        self.fc = nn.Linear(hidden * (2 if bidirectional else 1), 3)
        self.batch_first, self.head = batch_first, head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.rnn(x)[0]
        if self.head == "last":
            return self.fc(y[:, -1] if self.batch_first else y[-1])
        return self.fc(y)


# (kind, layers, batch_first, head, bidirectional): each kind with 1 and 2 layers, both
# layouts and both heads; bidirectional layers (one node each) in the 2-layer LSTM (more
# options of both ops against onnxruntime: NODE_CASES; their gradients:
# tests/test_training_ops.py)
CONFIGS = [("LSTM", 1, True, "last", False), ("LSTM", 2, False, "every", True),
           ("GRU", 1, False, "every", False), ("GRU", 2, True, "last", False)]
_CACHE: dict[tuple, tuple] = {}


def _ids(config: tuple) -> str:
    kind, layers, bf, head, bi = config
    return f"{kind}{layers}-{'bf' if bf else 'tf'}-{head}{'-bi' if bi else ''}"


def _captured(config: tuple) -> tuple:
    """(module, x, captured ModelProto, forward graph), captured once per session."""
    if config not in _CACHE:
        torch.manual_seed(CONFIGS.index(config))
        module = RNNNet(*config)
        x = torch.randn(3, 5, 4)
        model = capture_module(module, (x,)).model
        _CACHE[config] = (module, x, model, import_model(model))
    return _CACHE[config]


def _values(model: onnx.ModelProto, graph, x: torch.Tensor) -> dict[int, torch.Tensor]:
    """The file's weights, the constants and the input, by graph tensor id."""
    found = initializer_values(model, graph)
    values = {tid: torch.from_numpy(v.copy()) for tid, v in found.values.items()}
    values.update({tid: torch.from_numpy(np.array(v)) for tid, v in graph.constants.items()})
    values[graph.inputs[0]] = x
    return values


def _forward(model: onnx.ModelProto, graph, x: torch.Tensor) -> torch.Tensor:
    (out,) = run_graph(graph, _values(model, graph, x)).values()
    return out


def _onnxruntime(model: onnx.ModelProto, x: torch.Tensor) -> torch.Tensor:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {model.graph.input[0].name: x.numpy()})
    return torch.from_numpy(out)


def _close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    err = float((got - want).abs().max())
    scale = float(want.abs().max())
    assert err <= RTOL * max(scale, 1e-12), f"{what}: error {err:.3g}, max value {scale:.3g}"


@pytest.mark.parametrize("config", CONFIGS, ids=_ids)
def test_captured_layers_compute_the_module(config):
    module, x, model, graph = _captured(config)
    ops = [k.op_type for k in graph.kernels]
    assert ops.count(config[0]) == config[1]  # one ONNX node per layer
    with torch.no_grad():
        want = module.eval()(x)
    module.train()
    got = _forward(model, graph, x)
    _close(got, want, "output")
    _close(got, _onnxruntime(model, x), "output vs onnxruntime")


def _torch_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out.flatten(0, -2), y.flatten())


def _torch_sgd(module: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int
               ) -> tuple[list[float], dict[str, torch.Tensor]]:
    module = copy.deepcopy(module).train()
    opt = torch.optim.SGD(module.parameters(), lr=LR)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = _torch_loss(module(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {n: p.detach() for n, p in module.named_parameters()}


@pytest.mark.parametrize("config", CONFIGS, ids=_ids)
def test_sgd_steps_equal_torch_autograd(config):
    """3 SGD steps of the derived iteration (our LSTMGrad/GRUGrad, the Slice/Concat kernels
    that build ONNX's W, R, B from the module's tensors) against the module trained by torch."""
    module, x, model, graph = _captured(config)
    train = derive_training(graph, optimizer="sgd", learning_rate=LR)
    assert f"{config[0]}Grad" in {k.op_type for k in train.kernels}
    meta = train.meta["training"]
    values = _values(model, train, x)
    y = torch.randint(0, 3, train.tensors[meta["labels"]].shape,
                      generator=torch.Generator().manual_seed(1))
    values[meta["labels"]] = y
    steps = train_steps(train, 3, values=values)
    losses, params = _torch_sgd(module, x, y, 3)
    for step, (got, want) in enumerate(zip(steps, losses, strict=True)):
        assert got[meta["loss"]].item() == pytest.approx(want, rel=RTOL), step
    found = initializer_values(model, graph)
    trained = {train.tensors[w].name for w, _ in meta["weight_grads"]}
    sources = {n for d in found.derived.values() for n in d.initializers}
    assert trained == {n for n, _ in module.named_parameters()} - sources | {
        graph.tensors[t].name for t in found.derived}
    for first, last in train.carried:
        t = train.tensors[first]
        value = steps[-1][last]
        if first in found.derived:  # a Linear's W as MatMul(X, W^T): the graph holds W^T
            (source,) = found.derived[first].initializers
            _close(value.T, params[source], t.name)
        else:
            _close(value, params[t.name], t.name)


def _torchscript(module: nn.Module, x: torch.Tensor) -> onnx.ModelProto:
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation
        torch.onnx.export(module.eval(), (x,), buffer, dynamo=False)
    module.train()
    return onnx.load_from_string(buffer.getvalue())


def test_torchscript_export_imports_and_trains():
    """The TorchScript exporter writes ONNX's reordered W, R, B as initializers and a
    Squeeze/Transpose between layers: forward against the module and onnxruntime, training
    against torch.autograd of the graph's own forward kernels."""
    torch.manual_seed(5)
    module = RNNNet("LSTM", 2, True, "last")
    x = torch.randn(3, 5, 4)
    model = _torchscript(module, x)
    graph = import_model(model)
    assert [k.op_type for k in graph.kernels].count("LSTM") == 2
    got = _forward(model, graph, x)
    with torch.no_grad():
        _close(got, module.eval()(x), "output")
    module.train()
    _close(got, _onnxruntime(model, x), "output vs onnxruntime")
    train = derive_training(graph, optimizer="sgd", learning_rate=LR)
    values = _values(model, train, x)
    meta = train.meta["training"]
    values[meta["labels"]] = torch.tensor([0, 2, 1])
    grads = [g for _, g in meta["weight_grads"]]
    ours = train_steps(train, 2, values=values, keep=grads)
    ref = autograd_steps(train, 2, values=values)
    for got, want in zip(ours, ref, strict=True):
        for tid, value in want.items():
            _close(got[tid], value, train.tensors[tid].name)


# ---- ONNX options against onnxruntime ------------------------------------------------------
def _node_model(op: str, direction: str, *, lbr: int | None = None, bias: bool = True,
                states: bool = True, outputs: int = 3, seed: int = 0, **attrs) -> onnx.ModelProto:
    """One LSTM/GRU node (T 5, batch 3, input 4, hidden 6) with random initializers."""
    rng = np.random.default_rng(seed)
    d, g, h = (2 if direction == "bidirectional" else 1), (4 if op == "LSTM" else 3), 6

    def init(name: str, *shape: int) -> onnx.TensorProto:
        return helper.make_tensor(name, TensorProto.FLOAT, shape,
                                  (rng.standard_normal(shape) * 0.5).astype(np.float32).ravel())

    inits = [init("W", d, g * h, 4), init("R", d, g * h, h)] + ([init("B", d, 2 * g * h)]
                                                                 if bias else [])
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, (5, 3, 4))]
    slots = ["x", "W", "R", "B" if bias else "", ""]
    for name in ("h0", "c0")[: (2 if op == "LSTM" else 1)]:
        slots.append(name if states else "")
        if states:
            inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, (d, 3, h)))
    while not slots[-1]:
        slots.pop()
    names = ["Y", "Y_h", "Y_c"][: min(outputs, 3 if op == "LSTM" else 2)]
    if lbr is not None:
        attrs["linear_before_reset"] = lbr
    node = helper.make_node(op, slots, names, hidden_size=h, direction=direction, **attrs)
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names]
    graph = helper.make_graph([node], "g", inputs, outs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=9)


NODE_CASES = [("LSTM", "forward", None, True, True), ("LSTM", "reverse", None, False, False),
              ("LSTM", "bidirectional", None, True, True), ("GRU", "forward", 0, True, True),
              ("GRU", "reverse", 1, False, True), ("GRU", "bidirectional", 0, True, False)]


@pytest.mark.parametrize("op,direction,lbr,bias,states", NODE_CASES)
def test_every_output_matches_onnxruntime(op, direction, lbr, bias, states):
    model = _node_model(op, direction, lbr=lbr, bias=bias, states=states)
    graph = import_model(model)
    (kernel,) = graph.kernels
    assert len(kernel.inputs) == (6 if op == "LSTM" else 5)  # absent B, states: zeros
    rng = np.random.default_rng(1)
    feeds = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim])
             .astype(np.float32) for i in model.graph.input}
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)
    values = {graph.by_name(n).id: torch.from_numpy(v) for n, v in feeds.items()}
    values.update({tid: torch.from_numpy(np.array(v)) for tid, v in graph.constants.items()})
    found = initializer_values(model, graph)
    values.update({tid: torch.from_numpy(v.copy()) for tid, v in found.values.items()})
    got = run_graph(graph, values)
    for tid, w in zip(graph.outputs, want, strict=True):
        assert tuple(got[tid].shape) == w.shape
        np.testing.assert_allclose(got[tid].numpy(), w, rtol=1e-5, atol=1e-6)


def test_absent_outputs_get_tensors_and_layout_one_matches_the_reference_evaluator():
    model = _node_model("LSTM", "bidirectional", outputs=1)
    node = model.graph.node[0]
    node.output.extend(["", "Y_c"])
    model.graph.output.append(helper.make_tensor_value_info("Y_c", TensorProto.FLOAT, None))
    graph = import_model(model)
    (kernel,) = graph.kernels
    assert [graph.tensors[t].shape for t in kernel.outputs] == [(5, 2, 3, 6), (2, 3, 6),
                                                                (2, 3, 6)]
    # layout 1 (batch first): onnxruntime refuses it; onnx's reference evaluator computes it
    x = np.random.default_rng(2).standard_normal((3, 5, 4)).astype(np.float32)
    one = _node_model("GRU", "bidirectional", lbr=0, states=False, layout=1)
    one.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 3
    one.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 5
    graph = import_model(one)
    assert graph.tensors[graph.outputs[0]].shape == (3, 5, 2, 6)
    values = _values(one, graph, torch.from_numpy(x))
    got = run_graph(graph, values)
    want = ReferenceEvaluator(one).run(None, {"x": x})
    for tid, w in zip(graph.outputs, want, strict=True):
        np.testing.assert_allclose(got[tid].numpy(), w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("change,match", [
    ({"clip": 3.0}, "clip"), ({"activations": ["Relu", "Tanh", "Tanh"]}, "activations"),
    ({"input_forget": 1}, "input_forget"), ({"peephole": True}, "peephole"),
    ({"sequence_lens": [5, 4, 5]}, "sequence_lens")])
def test_what_the_kernels_do_not_compute_is_refused(change, match):
    change = dict(change)
    model = _node_model("LSTM", "forward", states=False)
    node = model.graph.node[0]
    if change.pop("peephole", False):
        node.input.extend(["", "", "", "P"])
        model.graph.initializer.append(helper.make_tensor("P", TensorProto.FLOAT, (1, 18),
                                                          [0.1] * 18))
    lens = change.pop("sequence_lens", None)
    if lens is not None:
        node.input.append("lens")
        model.graph.initializer.append(helper.make_tensor("lens", TensorProto.INT32, (3,),
                                                          lens))
    node.attribute.extend(helper.make_attribute(k, v) for k, v in change.items())
    with pytest.raises(UnsupportedOpError, match=match):
        import_model(model)
    if lens is not None:  # the full length everywhere is no restriction
        model.graph.initializer[-1].CopyFrom(helper.make_tensor("lens", TensorProto.INT32,
                                                                (3,), [5, 5, 5]))
        assert [k.op_type for k in import_model(model).kernels] == ["LSTM"]


# ---- a plan with moves, the Trainer ----------------------------------------------------------
def test_a_plan_with_moves_computes_the_reference_bitwise():
    """A GRU layer (an output per step) wide enough that the weights, not the 512-byte
    alignment of small tensors, make the peak: the plan at a budget halfway between the
    largest working set (GRUGrad and its recomputation workspace) and the peak moves
    tensors, and computes what the reference runner computes, bitwise."""
    torch.manual_seed(7)
    module = RNNNet("GRU", 1, False, "every", features=64, hidden=64)
    graph = import_model(capture_module(module, (torch.randn(6, 4, 64),)).model)
    train = derive_training(graph, optimizer="sgd", learning_rate=LR)
    assert train.kernels[train.max_working_set[1]].op_type == "GRUGrad"
    budget = (train.max_working_set[0] + train.peak_live_bytes) // 2
    result = optimize(train, PlanConfig(fast_mem_bytes=budget, device="cuda",
                                        strategy="async", run=RunMode()), costs=costs_for(train))
    assert result.plan is not None, result.message
    assert sum(1 for _ in result.plan.moves()) > 0
    reference = train_steps(train, steps=3, seed=4)
    for step, (got, want) in enumerate(zip(run_steps(train, result.plan, steps=3, seed=4),
                                           reference, strict=True)):
        for tid in train.outputs:
            assert torch.equal(got[tid], want[tid]), (step, train.name_of(tid))


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        # weights large next to the activations of 4 x 6 steps, so that a budget of 2/3 of
        # the peak holds the LSTMGrad kernels' recomputation workspace
        self.rnn = nn.LSTM(64, 64, batch_first=True)
        self.fc = nn.Linear(64, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.rnn(x)[0][:, -1])


def _batches(shape: tuple[int, ...], classes: int, count: int) -> list[tuple]:
    gen = torch.Generator().manual_seed(3)
    return [(torch.randn(*shape, generator=gen),
             torch.randint(0, classes, (shape[0],), generator=gen)) for _ in range(count)]


def _plain_training(module: nn.Module, data: list[tuple], lr: float = 0.1) -> list[float]:
    """The losses of SGD with momentum on `module` over `data`, as plain PyTorch trains."""
    opt = torch.optim.SGD(module.parameters(), lr=lr, momentum=0.9)
    losses = []
    for x, y in data:
        opt.zero_grad()
        loss = F.cross_entropy(module(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _trains_like(trainer: Trainer, ours: nn.Module, reference: nn.Module,
                 data: list[tuple]) -> None:
    """`trainer` (of `ours`, a copy of `reference` before training) gives plain PyTorch's
    losses and parameters over `data`."""
    want = _plain_training(reference, data)
    got = [float(trainer.step(x, y)) for x, y in data]
    trainer.sync()
    assert got == pytest.approx(want, rel=RTOL)
    for (name, p), (_, q) in zip(ours.named_parameters(), reference.named_parameters(),
                                 strict=True):
        _close(p.detach(), q.detach(), name)


def test_the_trainer_trains_an_lstm_classifier_like_pytorch(tmp_path):
    torch.manual_seed(0)
    reference = Classifier()
    ours = copy.deepcopy(reference)
    data = _batches((4, 6, 64), 5, 8)
    ours_opt = torch.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9)
    # recompute "off": the solve takes a third of the time, and with recompute on the plan
    # at this budget recomputes nothing either (18 moves both ways)
    trainer = Trainer(ours, ours_opt, F.cross_entropy, example=data[0], device="cpu",
                      ratio="2:1", plans_dir=tmp_path, recompute="off")
    assert sum(1 for _ in trainer.plan.moves()) > 0
    _trains_like(trainer, ours, reference, data)


class DeepClassifier(nn.Module):
    """Two LSTM layers over 10 steps of a batch of 16: their gradient kernels' recomputed tapes
    are more than half the training graph's peak."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.LSTM(4, 16, num_layers=2, batch_first=True)
        self.fc = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.rnn(x)[0][:, -1])


def test_the_trainer_chunks_recurrent_kernels_a_budget_cannot_hold(tmp_path, monkeypatch):
    """At half the peak, which the whole-batch LSTMGrad kernels cannot fit, the Trainer plans
    (as `optimize` does by default) its graph with them in batch chunks, runs that graph and
    trains as plain PyTorch; a second Trainer of the same model and budget takes the split plan
    from the plan cache; with the split off the budget is infeasible."""
    torch.manual_seed(0)
    reference = DeepClassifier()
    ours = copy.deepcopy(reference)
    data = _batches((16, 10, 4), 5, 6)

    def trainer(module: nn.Module, **options) -> Trainer:
        opt = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9)
        return Trainer(module, opt, F.cross_entropy, example=data[0], device="cpu",
                       ratio="1:1", plans_dir=tmp_path, recompute="off", **options)

    with pytest.raises(ConfigError, match="LSTMGrad"):
        trainer(copy.deepcopy(reference), plan_options={"split_conv_grads": "off"})
    ours_trainer = trainer(ours)
    chunked = [k.name for k in ours_trainer.run_graph.kernels if k.attr(CHUNKS_ATTR, 1) > 1]
    assert len(chunked) == 2 and all(k.endswith("/grad") for k in chunked)
    assert any(n.startswith("split 2 recurrent kernels") for n in ours_trainer.notes)
    _trains_like(ours_trainer, ours, reference, data)

    def no_solve(*args, **kwargs):
        raise AssertionError("solved again: the split plan was not taken from the cache")

    monkeypatch.setattr(pipeline_module, "optimize", no_solve)
    again = trainer(copy.deepcopy(reference))
    assert split_names(again.run_graph) == split_names(ours_trainer.run_graph)


def test_the_trainer_measures_the_chunked_kernels_of_its_split_and_plans_again(tmp_path,
                                                                              monkeypatch):
    """With profiling on (a GPU's default; here the CPU's, into a fresh profile cache), the
    Trainer measures the chunked kernels of the split its first plan chose, which were priced
    by estimate, and plans again with their times; a second Trainer takes that plan from the
    cache and measures nothing."""
    monkeypatch.setenv("AUTOTM_PROFILES", str(tmp_path / "profiles"))
    data = _batches((16, 10, 4), 5, 1)
    solves = []
    cached = pipeline_module.cached_optimize

    def counted(*args, **kwargs):
        solves.append(kwargs.get("fresh", False))
        return cached(*args, **kwargs)

    monkeypatch.setattr(pipeline_module, "cached_optimize", counted)

    def trainer() -> Trainer:
        torch.manual_seed(0)
        module = DeepClassifier()
        opt = torch.optim.SGD(module.parameters(), lr=0.1)
        return Trainer(module, opt, F.cross_entropy, example=data[0], device="cpu",
                       ratio="1:1", plans_dir=tmp_path / "plans", recompute="off",
                       profile=True)

    first = trainer()
    chunked = [k.id for k in first.run_graph.kernels if k.attr(CHUNKS_ATTR, 1) > 1]
    assert chunked and solves[0] is False and True in solves
    costs = pipeline_module.device_costs(first.run_graph, "cpu")
    assert not any(costs.estimated[k] for k in chunked)
    solves.clear()
    second = trainer()
    assert solves == [False]
    assert split_names(second.run_graph) == split_names(first.run_graph)


# ---- recurrent gradient kernels split into batch chunks (`ir.conv_split`) -------------------
def _chunk_case(kind: str, batch_first: bool, layers: int) -> tuple:
    """A training graph whose recurrent gradient kernels' tapes outweigh their operands, and
    the same graph split (`split_conv_grads`: each into batch chunks)."""
    torch.manual_seed(11)
    module = RNNNet(kind, layers, batch_first, "every", features=4, hidden=16)
    x = torch.randn(16, 40, 4) if batch_first else torch.randn(40, 16, 4)
    train = derive_training(import_model(capture_module(module, (x,)).model),
                            optimizer="sgd", learning_rate=LR)
    return train, split_conv_grads(train)


@pytest.mark.parametrize("kind, batch_first, layers", [("LSTM", True, 2), ("GRU", False, 1)])
def test_recurrent_kernels_in_batch_chunks_train_as_over_the_whole_batch(kind, batch_first,
                                                                         layers):
    train, split = _chunk_case(kind, batch_first, layers)
    chunked = [k for k in split.kernels if k.attr(CHUNKS_ATTR)]
    assert sorted(k.op_type for k in chunked) == [kind] * layers + [f"{kind}Grad"] * layers
    assert split_names(split) == tuple(sorted(chunked_name(k.name, k.attr(CHUNKS_ATTR))
                                              for k in chunked))
    for k in chunked:
        chunks, whole = k.attr(CHUNKS_ATTR), train.kernels[k.id]
        assert chunks == recurrent_chunks(train, whole) and 1 < chunks <= 16
        assert k.workspace_bytes == -(-whole.workspace_bytes // chunks)
        largest = max(train.tensors[t].nbytes for t in k.io)
        assert k.workspace_bytes <= largest < whole.workspace_bytes
    assert split.peak_live_bytes < train.peak_live_bytes
    assert splittable_kernels(split) == []  # chunked once: nothing left to split
    for got, want in zip(train_steps(split, 3, seed=2), train_steps(train, 3, seed=2),
                         strict=True):
        for tid in train.outputs:  # the sum of the slices' weight gradients: not bitwise
            torch.testing.assert_close(got[tid], want[tid], rtol=RTOL, atol=RTOL)


def test_a_split_list_entry_sets_the_chunks():
    train, _ = _chunk_case("GRU", False, 1)
    grad = next(k for k in train.kernels if k.op_type == "GRUGrad")
    split = split_conv_grads(train, [chunked_name(grad.name, 2)])
    assert [k.attr(CHUNKS_ATTR) for k in split.kernels if k.attr(CHUNKS_ATTR)] == [2]
    assert split_names(split) == (f"{grad.name}#2",)


@pytest.mark.parametrize("op,direction,lbr,bias,states", NODE_CASES)
def test_chunks_of_the_sequence_train_as_the_whole_layer(op, direction, lbr, bias, states):
    """A one-directional layer (forward or reverse) and its gradient kernel in 4 chunks of its
    5 steps (segments of 2, 1, 1, 1, the states handed from one to the next, the gradient
    back-propagated from the last segment the recurrence visits) train as the whole layer; a
    bidirectional one runs in chunks of its batch (3 of them) instead."""
    graph = import_model(_node_model(op, direction, lbr=lbr, bias=bias, states=states))
    train = derive_training(graph, optimizer="sgd", learning_rate=LR, loss="mse")
    layers = [k for k in train.kernels if k.op_type in (op, f"{op}Grad")]
    split = split_conv_grads(train, [chunked_name(k.name, 4) for k in layers])
    chunked = {k.op_type: k.attr(CHUNKS_ATTR) for k in split.kernels if k.attr(CHUNKS_ATTR)}
    assert chunked == dict.fromkeys((op, f"{op}Grad"), 3 if direction == "bidirectional" else 4)
    for got, want in zip(train_steps(split, 2, seed=4), train_steps(train, 2, seed=4),
                         strict=True):
        for tid in train.outputs:
            torch.testing.assert_close(got[tid], want[tid], rtol=RTOL, atol=RTOL)


def test_a_profile_measures_every_count_of_chunks():
    """`profile --split-conv-grads` measures the default split, then every recurrent kernel
    in each power-of-two count of chunks up to its sequence's steps (40 here), so that whatever
    count `auto` fits to a budget is priced by its own times."""
    train, split = _chunk_case("GRU", False, 1)
    variants = split_variants(train)
    assert split_names(variants[0]) == split_names(split)
    counts = [{k.attr(CHUNKS_ATTR) for k in v.kernels if k.attr(CHUNKS_ATTR)}
              for v in variants[1:]]
    default = {k.attr(CHUNKS_ATTR) for k in split.kernels if k.attr(CHUNKS_ATTR)}
    assert counts == [{c} for c in (2, 4, 8, 16, 32) if {c} != default]
    assert split_variants(variants[0]) == []  # nothing left to split


def test_a_chunked_kernel_is_priced_from_the_measured_whole_one():
    """Unmeasured, a recurrent kernel in k chunks of its sequence costs its whole kernel's
    measured time (the same steps at the same batch; a gradient kernel 4/3 of it, for its
    forward once more without a tape) and a k-th of its workspace."""
    train, split = _chunk_case("LSTM", True, 2)
    origins = part_origins(train, split)
    chunked = {k.id: k.attr(CHUNKS_ATTR) for k in split.kernels if k.attr(CHUNKS_ATTR)}
    assert sorted(chunked) == [k for k, (_, part) in enumerate(origins) if part]
    measured = replace(costs_for(train), workspace_bytes=tuple(
        (1 << 20) * (k.op_type in ("LSTM", "LSTMGrad")) for k in train.kernels))
    fresh = costs_for(split)
    estimated = replace(fresh, estimated=tuple(part for _, part in origins))
    factors = {k.id: chunked_time_factor(k) for k in split.kernels if k.attr(CHUNKS_ATTR)}
    costs = measured.spliced(origins, estimated, chunked, factors)
    for k, chunks in chunked.items():
        grad = split.kernels[k].op_type.endswith("Grad")
        assert factors[k] == pytest.approx(4 / 3 if grad else 1)
        assert costs.times_s[k] == pytest.approx(factors[k] * measured.times_s[k])
        theirs = fresh.workspace_bytes[k] if fresh.workspace_bytes else 0
        assert costs.workspace_bytes[k] == max(theirs, -(-(1 << 20) // chunks))
    assert measured.spliced(origins, fresh, chunked).times_s[min(chunked)] == \
        fresh.times_s[min(chunked)]  # measured chunks: their own times


def test_auto_chunks_the_lstm_gradient_a_budget_cannot_hold(monkeypatch, tmp_path):
    """Below the smallest budget the whole-batch LSTMGrad allows, `--split-conv-grads auto`
    chunks it, plans, and the plan trains as the unsplit graph; a plan file rebuilds it."""
    monkeypatch.setattr(pipeline_module, "load_costs", lambda graph, **kw: costs_for(graph))
    monkeypatch.setattr(workload_module, "load_costs", lambda graph, **kw: costs_for(graph))
    train, split = _chunk_case("LSTM", True, 2)
    config = PlanConfig(fast_mem_bytes=1 << 40, device="cuda", strategy="sync",
                        recompute="off", run=RunMode())
    def smallest(graph) -> int:
        machine = pipeline_module.machine_for(graph, config, costs_for(graph))
        return smallest_budget(machine, "sync").budget_bytes
    before, after = smallest(train), smallest(split)
    assert after < before
    budget = (before + after) // 2
    off = optimize(train, replace(config, fast_mem_bytes=budget), costs=costs_for(train))
    assert off.status == "infeasible" and "LSTMGrad" in off.message
    result = optimize(train, replace(config, fast_mem_bytes=budget, split_conv_grads="auto"),
                      costs=costs_for(train))
    assert result.plan is not None and result.graph is not None, result.message
    assert any(n.startswith("split ") and " recurrent kernels into chunks of the sequence so "
               "that the budget fits" in n for n in result.plan.header.notes)
    assert result.fast_peak_bytes <= budget
    for got, want in zip(run_steps(result.graph, result.plan, steps=2, seed=4),
                         train_steps(train, 2, seed=4), strict=True):
        for tid in train.outputs:
            torch.testing.assert_close(got[tid], want[tid], rtol=RTOL, atol=RTOL)
    path = tmp_path / "plan.json"
    result.plan.save(path)
    assert Plan.load(path).header.model.split_conv_grads == split_names(result.graph)


# ---- constant folding of T5's relative-position buckets -----------------------------------
class RelativeBias(nn.Module):
    """T5's relative-position bias: buckets of an arange-derived distance matrix, folded to a
    constant index table at import, then an embedding lookup."""

    def __init__(self, bidirectional: bool, buckets: int = 32, max_distance: int = 128) -> None:
        super().__init__()
        self.emb = nn.Embedding(buckets, 2)
        self.bidirectional, self.buckets, self.max_distance = (bidirectional, buckets,
                                                               max_distance)

    def bucket(self, rel: torch.Tensor) -> torch.Tensor:
        buckets, out = self.buckets, torch.zeros_like(rel)
        if self.bidirectional:
            buckets //= 2
            out = out + (rel > 0).to(torch.long) * buckets
            rel = torch.abs(rel)
        else:
            rel = -torch.min(rel, torch.zeros_like(rel))
        max_exact = buckets // 2
        large = max_exact + (torch.log(rel.float() / max_exact)
                             / math.log(self.max_distance / max_exact)
                             * (buckets - max_exact)).to(torch.long)
        large = torch.min(large, torch.full_like(large, buckets - 1))
        return out + torch.where(rel < max_exact, rel, large)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        steps = torch.arange(x.shape[1])
        table = self.bucket(steps[None, :] - steps[:, None])
        return x + self.emb(table).permute(2, 0, 1).unsqueeze(0)


@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5_bucket_folding_prints_no_numpy_warning(bidirectional):
    """log(0) of the zero distance, its cast to int64 and the like fold without a warning, in
    our folding (`fold_eval`, both exporters' files) and in the capture's (onnxscript's), and
    give the values torch and onnxruntime compute."""
    torch.manual_seed(0)
    module = RelativeBias(bidirectional).eval()
    x = torch.randn(1, 16, 16)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        models = [_torchscript(module, x)]
        if bidirectional:  # one capture: the dynamo exporter takes seconds
            models.append(capture_module(module, (x,)).model)
        graphs = [(model, import_model(model)) for model in models]
    numeric = [w for w in seen if issubclass(w.category, RuntimeWarning)]
    assert not numeric, [f"{w.filename}:{w.lineno}: {w.message}" for w in numeric]
    with torch.no_grad():
        want = module(x)
    for model, graph in graphs:
        assert "Log" not in {k.op_type for k in graph.kernels}  # the index table folded
        got = _forward(model, graph, x)
        assert torch.equal(got, want)
        assert torch.equal(got, _onnxruntime(model, x))


def test_initial_states_that_are_weights_get_gradients():
    """A learned initial state (a weight in the initial_h slot) is trained through GRUGrad."""
    model = _node_model("GRU", "forward", lbr=1, states=False)
    h0 = helper.make_tensor("h0", TensorProto.FLOAT, (1, 3, 6), [0.1] * 18)
    model.graph.initializer.append(h0)
    model.graph.node[0].input.extend(["", "h0"])
    graph = import_model(model)
    assert graph.by_name("h0").role is Role.WEIGHT
    train = derive_training(graph, loss="mse")
    grad = next(k for k in train.kernels if k.op_type == "GRUGrad")
    assert grad.attr("output_mask") == (0, 1, 1, 1, 1)  # X is an input: no gradient
    grads = [g for _, g in train.meta["training"]["weight_grads"]]
    ours = train_steps(train, 2, seed=1, keep=grads)
    ref = autograd_steps(train, 2, seed=1)
    for got, want in zip(ours, ref, strict=True):
        for tid, value in want.items():
            _close(got[tid], value, train.tensors[tid].name)
