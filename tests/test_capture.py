"""Capturing torch modules as ONNX (`frontend/capture.py`) and reading the file's weights back
onto an imported graph (`frontend/weights.py`): an MLP, a CNN with BatchNorm, and a small
language model whose embedding is tied to its output layer. Each is captured once (about 1 s
each with the dynamo exporter), imported, derived for training, and its graph weights must be
the module's tensors bit for bit, in the graph's layout."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from autotm_py.errors import ModelImportError
from autotm_py.frontend.capture import Captured, capture_module
from autotm_py.frontend.onnx import import_model, import_onnx
from autotm_py.frontend.weights import file_weights, initializer_values
from autotm_py.ir.graph import Role
from autotm_py.ir.training import derive_training
from autotm_py.runtime.reference import run_graph


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(4 * 4 * 4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.bn(self.conv(x))))
        return self.fc(torch.flatten(x, 1))


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for z in self.qkv(self.ln1(x)).split(d, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.drop(self.proj(y.transpose(1, 2).reshape(b, t, d)))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 32, d: int = 16, heads: int = 2, layers: int = 2,
                 ctx: int = 8) -> None:
        super().__init__()
        self.emb, self.pos = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight  # tied

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx) + self.pos(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def _make(name: str) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    if name == "mlp":
        return MLP(), (torch.randn(2, 8),)
    if name == "cnn":
        cnn = CNN()
        with torch.no_grad():  # running statistics unlike any parameter's values
            cnn.bn.running_mean.uniform_(-1, 1)
            cnn.bn.running_var.uniform_(0.5, 2)
        return cnn, (torch.randn(2, 3, 8, 8),)
    return TinyLM(), (torch.randint(0, 32, (2, 8)),)


MODELS = ("mlp", "cnn", "lm")
_CACHE: dict[str, tuple] = {}


def _captured(name: str, tmp_path_factory) -> tuple:
    """(name, module, example, captured, forward graph, files the export left in its cwd);
    each model is captured once per session, in an empty working directory."""
    if name not in _CACHE:
        module, example = _make(name)
        here, cwd = os.getcwd(), tmp_path_factory.mktemp(f"capture-{name}")
        os.chdir(cwd)
        try:
            captured = capture_module(module, example)
        finally:
            os.chdir(here)
        _CACHE[name] = (module, example, captured, import_model(captured.model),
                        os.listdir(cwd))
    return (name, *_CACHE[name])


@pytest.fixture(params=MODELS)
def case(request, tmp_path_factory):
    return _captured(request.param, tmp_path_factory)


@pytest.fixture
def mlp(tmp_path_factory):
    return _captured("mlp", tmp_path_factory)


@pytest.fixture
def cnn(tmp_path_factory):
    return _captured("cnn", tmp_path_factory)


@pytest.fixture
def lm(tmp_path_factory):
    return _captured("lm", tmp_path_factory)


def _module_tensor(module: nn.Module, name: str) -> torch.Tensor:
    return dict([*module.named_parameters(), *module.named_buffers()])[name]


def _expected(module: nn.Module, captured: Captured, found, t) -> np.ndarray:
    """The module tensor a graph weight holds, in the graph's layout."""
    if t.id not in found.derived:
        return _module_tensor(module, captured.module_name(t.name)).detach().numpy()
    derived = found.derived[t.id]
    assert derived.ops == ("Transpose",), derived  # a Linear's W as MatMul(X, W^T)
    (source,) = derived.initializers
    return _module_tensor(module, captured.module_name(source)).detach().numpy().T


# ---- capture ---------------------------------------------------------------------------------
def test_every_module_tensor_read_is_one_initializer(case):
    name, module, _, captured, _, _ = case
    state = dict(module.state_dict())
    inits = {t.name for t in captured.model.graph.initializer}
    assert inits == set(captured.sources) == captured.trainable | captured.buffers
    assert not captured.frozen
    mapped = [n for names in captured.sources.values() for n in names]
    assert sorted(mapped + list(captured.unused)) == sorted(state)  # each name exactly once
    assert captured.trainable == {n for n, _ in module.named_parameters()}  # canonical names
    assert captured.inputs == (("idx",) if name == "lm" else ("x",))



def computes_the_module(module: nn.Module, x: torch.Tensor, captured, graph) -> None:
    """The imported graph, run on the captured values, gives the module's output (eval mode)."""
    found = initializer_values(captured.model, graph)
    leaves = {tid: torch.from_numpy(v) for tid, v in found.values.items()}
    leaves.update({tid: torch.from_numpy(np.array(v)) for tid, v in graph.constants.items()})
    leaves.update(zip(graph.inputs, (x,), strict=True))
    (out,) = run_graph(graph, leaves).values()
    with torch.no_grad():
        want = module.eval()(x)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)

def test_the_tied_weight_is_one_initializer_with_both_names(lm):
    _, _, _, captured, graph, _ = lm
    assert captured.sources["emb.weight"] == ("emb.weight", "head.weight")
    assert "head.weight" not in captured.sources
    tied = [t for t in graph.tensors if t.name == "emb.weight"]
    assert len(tied) == 1 and tied[0].role is Role.WEIGHT
    # two users: the embedding's Gather and the output Linear (transB = 1, the same bytes)
    assert {graph.kernels[k].op_type for k in tied[0].users} == {"Gather", "Linear"}


def test_batchnorm_statistics_are_buffers(cnn):
    _, module, _, captured, graph, _ = cnn
    assert captured.buffers == {"bn.running_mean", "bn.running_var"}
    assert captured.unused == ("bn.num_batches_tracked",)  # eval mode never reads it
    assert module.training  # the export's eval mode was undone
    train = derive_training(graph)
    trained = {train.tensors[w].name for w, _ in train.meta["training"]["weight_grads"]}
    assert trained == set(captured.trainable)
    carried = {train.tensors[a].name for a, _ in train.carried}
    assert captured.buffers <= carried  # updated with the batch statistics, not trained


def test_folded_constants_are_constants_not_weights(case):
    """The causal mask and the attention scale the exporter computes are Constant nodes, so
    the importer makes them CONSTANT tensors, which training never updates (and which the
    attention fusion turns into its `is_causal` and `scale`)."""
    name, module, _, captured, graph, _ = case
    weights = sum(t.numel for t in graph.tensors if t.role is Role.WEIGHT)
    assert weights == sum(_module_tensor(module, n).numel() for n in captured.sources)
    if name == "lm":  # 2 blocks: a float 8 x 8 mask and two scalar scales each
        unfused = import_model(captured.model, name="lm", initializer_weights=True, fuse=False)
        shapes = sorted(t.shape for t in unfused.tensors
                        if t.role is Role.CONSTANT and t.dtype == "float32")
        assert shapes == [(1,)] * 4 + [(8, 8)] * 2
        assert not [t for t in graph.tensors if t.role is Role.CONSTANT and
                    t.dtype == "float32"]
        assert [k.attr("is_causal") for k in graph.kernels
                if k.op_type == "ScaledDotProductAttention"] == [1, 1]


def test_a_bias_free_convolution_has_no_bias_and_a_zero_trainable_bias_stays():
    """The dynamo exporter gives a bias-free convolution a constant bias of zeros; adding it
    is a broadcast add per convolution (2.1 ms of ResNet-50 b64's step on an H200), so the
    importer drops it. A trainable bias that happens to be zero is a weight and stays."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.ReLU(),
                        nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(),
                        nn.ConvTranspose2d(4, 2, 2, stride=2, bias=False))
    with torch.no_grad():
        net[2].bias.zero_()
    x = torch.randn(2, 3, 8, 8)
    captured = capture_module(net, (x,))
    graph = import_model(captured.model, name="convs", initializer_weights=True)
    convs = [k for k in graph.kernels if k.op_type in ("Conv", "ConvRelu", "ConvTranspose")]
    assert [[graph.name_of(i) for i in k.inputs[1:]] for k in convs] == \
        [["0.weight"], ["2.weight", "2.bias"], ["4.weight"]]
    found = initializer_values(captured.model, graph)
    leaves = {tid: torch.from_numpy(v) for tid, v in found.values.items()}
    leaves.update({tid: torch.from_numpy(np.array(v)) for tid, v in graph.constants.items()})
    leaves[graph.inputs[0]] = x
    (out,) = run_graph(graph, leaves).values()
    with torch.no_grad():
        torch.testing.assert_close(out, net(x), rtol=1e-5, atol=1e-6)


def test_eval_mode_export_has_no_dropout(lm):
    _, module, _, _, graph, _ = lm
    assert any(isinstance(m, nn.Dropout) for m in module.modules())
    assert "Dropout" not in {k.op_type for k in graph.kernels}


def test_training_flags_are_restored_and_frozen_parameters_named():
    module, example = _make("mlp")
    module.train()
    module.layers[2].eval()  # a submodule in eval mode stays so
    module.layers[0].weight.requires_grad_(False)
    captured = capture_module(module, example, names=["features"])
    assert captured.inputs == ("features",)
    assert captured.frozen == {"layers.0.weight"}
    assert "layers.0.weight" not in captured.trainable
    assert module.training and module.layers[0].training and not module.layers[2].training


def test_the_export_writes_no_file(case):
    assert case[5] == []


# ---- import, training, and the file's values on the graph ------------------------------------
def test_imports_and_derives_a_training_iteration(case):
    name, _, _, captured, graph, _ = case
    ops = {k.op_type for k in graph.kernels}
    assert {"mlp": {"Gemm"}, "cnn": {"Conv", "BatchNormalization", "MaxPool"},
            "lm": {"LayerNormalization", "Gelu", "Linear", "ScaledDotProductAttention"}}[name] \
        <= ops
    train = derive_training(graph, optimizer="sgd", loss="auto")
    assert len(train.meta["training"]["weight_grads"]) == len(captured.trainable)


def test_weight_values_are_the_module_tensors_bitwise(case):
    _, module, _, captured, graph, _ = case
    found = initializer_values(captured.model, graph)
    assert found.missing == ()
    assert set(found.values) == {t.id for t in file_weights(graph)}
    for t in file_weights(graph):
        value = found.values[t.id]
        assert value.shape == t.shape and value.dtype == np.float32
        assert value.tobytes() == np.ascontiguousarray(
            _expected(module, captured, found, t)).tobytes(), t.name


def test_transposed_linear_weights_are_converted(case):
    """torch's Linear exported as MatMul(X, Transpose(W)) imports as a weight W^T of shape
    (in, out), named after the Transpose: its value is the module's W transposed."""
    name, module, _, captured, graph, _ = case
    found = initializer_values(captured.model, graph)
    if name != "lm":
        assert found.derived == {}  # Gemm (transB = 1) and Conv read the file's layout
        return
    qkv = next(t for t in graph.tensors if t.id in found.derived
               and found.derived[t.id].initializers == ("blocks.0.qkv.weight",))
    assert qkv.shape == (16, 48) and module.blocks[0].qkv.weight.shape == (48, 16)
    assert len(found.derived) == 8  # qkv, proj, fc1, fc2 of both blocks; not the tied head


def test_the_graph_computes_the_module_with_the_file_values(case):
    """End to end: the imported graph on the file's values gives the module's output."""
    _, module, example, captured, graph, _ = case
    found = initializer_values(captured.model, graph)
    leaves = {tid: torch.from_numpy(v) for tid, v in found.values.items()}
    leaves.update({tid: torch.from_numpy(np.array(v)) for tid, v in graph.constants.items()})
    leaves.update(zip(graph.inputs, example, strict=True))
    (out,) = run_graph(graph, leaves).values()
    with torch.no_grad():
        want = module.eval()(*example)
    module.train()
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


def test_training_graphs_keep_the_mapping(case):
    _, _, _, captured, graph, _ = case
    forward = initializer_values(captured.model, graph)
    train = derive_training(graph, optimizer="adam")
    found = initializer_values(captured.model, train)
    assert set(found.values) == set(forward.values)
    for tid, value in forward.values.items():
        assert train.tensors[tid].name == graph.tensors[tid].name
        assert found.values[tid].tobytes() == value.tobytes()


# ---- external data ---------------------------------------------------------------------------
def _save_external(captured: Captured, folder, threshold: int) -> str:
    """The captured model as a file whose initializers of at least `threshold` bytes are in
    `weights.bin` beside it."""
    model = onnx.ModelProto()
    model.CopyFrom(captured.model)
    path = str(folder / "mlp.onnx")
    onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=threshold)
    return path


def test_external_data_is_read_from_the_model_folder(mlp, tmp_path):
    _, module, _, captured, _, _ = mlp
    path = _save_external(captured, tmp_path, threshold=0)
    graph = import_onnx(path)
    found = initializer_values(path, graph)
    assert found.missing == ()
    for t in file_weights(graph):
        want = _module_tensor(module, t.name).detach().numpy()
        assert found.values[t.id].tobytes() == want.tobytes()


def test_missing_external_data_is_reported_not_refused(mlp, tmp_path):
    _, _, _, captured, _, _ = mlp
    path = _save_external(captured, tmp_path, threshold=256)  # the 2 weights, not the biases
    os.remove(tmp_path / "weights.bin")
    graph = import_onnx(path)
    assert graph.meta["missing_external_data"] == ["weights.bin"]
    found = initializer_values(path, graph)
    missing = {graph.tensors[t].name for t in found.missing}
    assert missing == {"layers.0.weight", "layers.2.weight"}
    assert {graph.tensors[t].name for t in found.values} == {"layers.0.bias", "layers.2.bias"}


def test_a_graph_of_another_model_is_refused(mlp, cnn):
    with pytest.raises(ModelImportError, match="not imported from this model"):
        initializer_values(cnn[3].model, mlp[4])


def test_non_persistent_buffers_are_constants_not_state(tmp_path):
    """A buffer registered with `persistent=False` (transformers' rotary `inv_freq`, read by
    the cos and the sin) is a constant the module derives, folded into what it makes: no
    initializer, `unused`, so the Trainer does not see one tensor in two weight slots. A
    persistent buffer stays state."""
    from autotm_py.trainer import Trainer

    class Rotary(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 8)
            self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, 8, 2) / 8.0),
                                 persistent=False)
            self.register_buffer("scale", torch.linspace(0.5, 2.0, 8))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            angles = torch.outer(torch.arange(x.shape[1], dtype=torch.float32), self.inv_freq)
            angles = torch.cat((angles, angles), -1)
            h = self.lin(x) * self.scale
            return (h * angles.cos() + h.flip(-1) * angles.sin()).mean(1)

    torch.manual_seed(0)
    module, x = Rotary(), torch.randn(2, 6, 8)
    captured = capture_module(module, (x,))
    assert "inv_freq" in captured.unused and "inv_freq" not in captured.sources
    assert captured.buffers == {"scale"}
    graph = import_model(captured.model, name="rotary", initializer_weights=True)
    computes_the_module(module, x, captured, graph)
    y = torch.tensor([1, 3])
    trainer = Trainer(module, torch.optim.SGD(module.parameters(), lr=0.1), F.cross_entropy,
                      example=(x, y), device="cpu", ratio="1:0", plans_dir=tmp_path)
    with torch.no_grad():
        want = F.cross_entropy(module(x), y)
    torch.testing.assert_close(trainer.step(x, y), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_initializer_with_other_bytes_than_its_module_tensor_is_refused(dtype):
    from onnx import helper

    from autotm_py.frontend.capture import _check_bytes

    tensor = torch.arange(6, dtype=torch.float32).reshape(2, 3).to(dtype)
    raw = tensor.reshape(-1).view(torch.uint8).numpy().tobytes()
    kind = onnx.TensorProto.FLOAT if dtype == torch.float32 else onnx.TensorProto.BFLOAT16
    _check_bytes(helper.make_tensor("w", kind, (2, 3), raw, raw=True), tensor, "w")
    other = bytearray(raw)
    other[-1] ^= 1
    with pytest.raises(ModelImportError, match="'w' is not the module's tensor"):
        _check_bytes(helper.make_tensor("w", kind, (2, 3), bytes(other), raw=True), tensor, "w")
    with pytest.raises(ModelImportError, match="shape"):
        _check_bytes(helper.make_tensor("w", kind, (3, 2), raw, raw=True), tensor, "w")


@pytest.mark.parametrize("name", ["cnn", "lm"])
def test_a_capture_without_values_copies_no_weight_and_imports_alike(name, tmp_path_factory):
    """`values=False` (the Trainer's capture): every floating-point module tensor's
    initializer is a shape and dtype only, marked as external data nothing reads; the names,
    the mapping and the imported graph are those of the capture with values."""
    _, module, example, captured, _, _ = _captured(name, tmp_path_factory)
    bare = capture_module(module, example, values=False)
    assert bare.sources == captured.sources and bare.trainable == captured.trainable
    floating = {n for n, t in [*module.named_parameters(), *module.named_buffers()]
                if t.is_floating_point()}
    for init in bare.model.graph.initializer:
        left_out = init.data_location == onnx.TensorProto.EXTERNAL
        assert left_out == (init.name in floating)
        assert not (left_out and (init.raw_data or init.float_data))
    again, want = (import_model(c.model, initializer_weights=True) for c in (bare, captured))
    assert [(k.op_type, k.name) for k in again.kernels] == \
        [(k.op_type, k.name) for k in want.kernels]
    assert [(t.name, t.shape, t.dtype, t.role) for t in again.tensors] == \
        [(t.name, t.shape, t.dtype, t.role) for t in want.tensors]


def test_a_capture_without_values_checks_the_exporter_holds_the_modules_tensor(monkeypatch):
    """Without the bytes to compare, the exporter's initializer must be the module's tensor
    itself (the same memory): one it computed or copied is refused as `_check_bytes` refuses
    other bytes."""
    module, example = _make("mlp")
    export = torch.onnx.export

    def copying(*args, **kwargs):
        program = export(*args, **kwargs)
        value = next(iter(program.model.graph.initializers.values()))
        value.const_value = type(value.const_value)(value.const_value.raw.detach().clone(),
                                                    name=value.name)
        return program

    monkeypatch.setattr(torch.onnx, "export", copying)
    capture_module(module, example)  # with values: the copy has the same bytes
    with pytest.raises(ModelImportError, match="is not the module's tensor of that name"):
        capture_module(module, example, values=False)
