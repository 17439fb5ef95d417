"""Language-model heads of every common form chunk (`--loss-chunks`, `ir/heads.py`; issue 45
item 1): small torch LMs (an embedding, a Linear + tanh, then the head) exported by torch's
TorchScript exporter (`dynamo=False`, its defaults), by the dynamo exporter (`dynamo=True`,
its defaults) and by `capture_module` (the Trainer's path), imported, and trained 2 SGD steps
with the loss chunked in 4 blocks: the same losses and updated weights as the plain loss and
as torch.autograd of the module on the file's weights. `autotm inspect` names the head.

What the exporters write (torch 2.13): a Linear with a bias is MatMul + Add everywhere (the
fusion pass's Linear); a bias-free one is MatMul by a (d, vocab) weight (the exporters fold
W^T into an initializer of their own; `capture_module` keeps the Transpose and our importer
folds it), except a tied one under `capture_module`, whose Transpose of the embedding stays
and fuses into Linear with transB = 1 on the one (vocab, d) table; 2-d rows are a Gemm. The
exporters' folding unties a tied 3-d head in the file itself (the embedding and a transposed
copy are two initializers): those graphs train two tensors, as torch would with the tie cut.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import warnings

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from autotm_py.cli import main
from autotm_py.cli.inspect import inspect_report
from autotm_py.errors import ConfigError
from autotm_py.frontend.capture import capture_module
from autotm_py.frontend.onnx import import_model
from autotm_py.frontend.weights import initializer_values
from autotm_py.ir import Role, TensorGraph
from autotm_py.ir.training import derive_training
from autotm_py.runtime.reference import init_values, train_steps
from tests.test_training_models import Net, small_cnn

V, D, B, L = 24, 8, 2, 5  # vocabulary, width, batch, sequence: 10 rows, 4 blocks of 3
LR, STEPS, CHUNKS = 0.5, 2, 4


class LM(nn.Module):
    """emb -> Linear + tanh -> the head in form `form`."""

    def __init__(self, form: str) -> None:
        super().__init__()
        self.form = form
        self.emb, self.fc = nn.Embedding(V, D), nn.Linear(D, D)
        if form in ("linear-bias", "linear", "gemm"):
            self.head = nn.Linear(D, V, bias=form != "linear")
        elif form == "tied":
            self.head = nn.Linear(D, V, bias=False)
            self.head.weight = self.emb.weight
        if form in ("tied-bias", "gemm-tied"):
            self.hb = nn.Parameter(torch.randn(V) / 4)
        self.cut: nn.Parameter | None = None  # the head's copy of the table, once untied

    def table(self) -> torch.Tensor:
        return self.emb.weight if self.cut is None else self.cut

    def untie(self) -> str:
        """Give the head its own copy of the embedding (what a file that unties it trains);
        the new parameter's name."""
        copy = nn.Parameter(self.emb.weight.detach().clone())
        if self.form == "tied":
            self.head.weight = copy
            return "head.weight"
        self.cut = copy
        return "cut"

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(self.fc(self.emb(idx)))
        form = self.form
        if form == "matmul-t":
            return x @ self.table().T
        if form == "f-linear":
            return F.linear(x, self.table())
        if form == "tied-bias":
            return F.linear(x, self.table(), self.hb)
        if form == "gemm":
            return self.head(x.reshape(-1, D))
        if form == "gemm-tied":
            return F.linear(x.reshape(-1, D), self.table(), self.hb)
        return self.head(x)


TIED = ("tied", "matmul-t", "f-linear", "tied-bias", "gemm-tied")
FOLDING = ("torchscript", "dynamo")  # their default folding writes W^T as its own initializer
# (form, exporter) -> the head `inspect` names: op, transB, tied, has a bias
CASES = {
    **{(f, e): ("Linear", 0, False, True) for f in ("linear-bias",) for e in (*FOLDING, "capture")},
    **{(f, e): ("MatMul", 0, False, False) for f in ("linear",) for e in (*FOLDING, "capture")},
    **{(f, e): ("MatMul", 0, False, False) for f in ("tied", "matmul-t", "f-linear")
       for e in FOLDING},
    **{(f, "capture"): ("Linear", 1, True, False) for f in ("tied", "matmul-t", "f-linear")},
    ("tied", "torchscript-nofold"): ("Linear", 1, True, False),
    ("tied-bias", "torchscript"): ("Linear", 0, False, True),
    ("tied-bias", "capture"): ("Linear", 1, True, True),
    ("gemm", "torchscript"): ("Gemm", 1, False, True),
    ("gemm-tied", "torchscript"): ("Gemm", 1, True, True),
}
_CACHE: dict[tuple[str, str], tuple[LM, torch.Tensor, onnx.ModelProto, TensorGraph]] = {}


def _export(module: LM, tokens: torch.Tensor, exporter: str) -> onnx.ModelProto:
    if exporter == "capture":
        return capture_module(module, (tokens,)).model
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            return torch.onnx.export(module.eval(), (tokens,), dynamo=True).model_proto
        buffer = io.BytesIO()
        torch.onnx.export(module.eval(), (tokens,), buffer, dynamo=False,
                          do_constant_folding=exporter == "torchscript")
        return onnx.load_from_string(buffer.getvalue())


def _case(form: str, exporter: str) -> tuple[LM, torch.Tensor, onnx.ModelProto, TensorGraph]:
    """(module, tokens, the exported model, its imported forward graph), once per session."""
    if (form, exporter) not in _CACHE:
        torch.manual_seed(0)
        module, tokens = LM(form), torch.randint(0, V, (B, L))
        model = _export(module, tokens, exporter)
        _CACHE[form, exporter] = (module, tokens, model, import_model(model))
    return _CACHE[form, exporter]


def _derive(graph: TensorGraph, chunks: int) -> TensorGraph:
    return derive_training(graph, loss="ce-last", learning_rate=LR, loss_chunks=chunks)


def _text(spec: tuple[str, int, bool, bool]) -> str:
    """The start of the words `inspect` says, as a regular expression."""
    op, trans, tied, _bias = spec
    what = ("the transposed " if trans else "the ") + ("tied embedding" if tied else "weight")
    return {"Linear": f"Linear \\(MatMul by {what} '", "Gemm": f"Gemm \\(by {what} '",
            "MatMul": f"MatMul by {what} '"}[op]


@pytest.fixture(params=sorted(CASES), ids=lambda c: f"{c[0]}-{c[1]}")
def case(request):
    return (*request.param, CASES[request.param], *_case(*request.param))


def test_the_head_chunks_and_inspect_names_it(case):
    *_, spec, _, _, _, graph = case
    _, trans, _, bias = spec
    chunked = _derive(graph, CHUNKS)
    head = chunked.meta["training"]["head"]
    assert (head["op"], head["transB"], head["tied"], head["bias"] is not None) == spec
    assert re.match(_text(spec), head["text"]), head["text"]
    (lce,) = [k for k in chunked.kernels if k.op_type == "LinearCrossEntropy"]
    assert lce.attr("chunks") == CHUNKS and lce.attr("transB") == trans
    assert len(lce.inputs) == (4 if bias else 3)
    assert not any(t.shape[-1:] == (V,) and len(t.shape) > 1 and t.role == Role.ACTIVATION
                   for t in chunked.tensors)  # no logits-sized tensor
    assert inspect_report(chunked)["head"] == {**head, "chunks": CHUNKS}  # inspect --json
    # the plain loss records the head too (inspect --json; the hint where logits set the WS)
    assert inspect_report(_derive(graph, 1))["head"] == {**head, "chunks": 1}


@pytest.mark.parametrize("form, exporter, flag", [("tied", "capture", None),
                                                  ("gemm", "torchscript", "--json")])
def test_the_cli_says_which_head_it_chunked(form, exporter, flag, tmp_path, capsys):
    _, _, model, graph = _case(form, exporter)
    path = tmp_path / "lm.onnx"
    onnx.save(model, path)
    args = ["inspect", str(path), "--training", "--loss", "ce-last", "--loss-chunks", "4"]
    assert main([*args, *([flag] if flag else [])]) == 0
    out = capsys.readouterr().out
    text = _derive(graph, CHUNKS).meta["training"]["head"]["text"]
    if flag:
        assert json.loads(out)["head"]["text"] == text
    else:
        assert f"\nhead         {text}, chunked in 4\n" in out
        assert text == "Linear (MatMul by the transposed tied embedding 'emb.weight')"


@pytest.mark.parametrize("form, exporter", sorted(c for c in CASES if c[0] in TIED))
def test_a_tied_embedding_stays_one_tensor(form, exporter):
    """Where the file has one table (capture, TorchScript without constant folding, a 2-d
    Gemm head), the graph has one weight read by the Gather and the head, and so does the
    chunked graph; where an exporter folded W^T into an initializer of its own, the file has
    two and so does the graph."""
    op, _, tied, _ = CASES[form, exporter]
    *_, graph = _case(form, exporter)
    tables = [t for t in graph.tensors if t.role == Role.WEIGHT and t.numel == V * D]
    if not tied:
        assert exporter in FOLDING and len(tables) == 2
        return
    (table,) = tables
    assert table.shape == (V, D)
    assert {graph.kernels[k].op_type for k in table.users} == {"Gather", op}
    chunked = _derive(graph, CHUNKS)
    assert {chunked.kernels[k].op_type for k in chunked.by_name(table.name).users} >= \
        {"Gather", "LinearCrossEntropy"}
    assert sum(t.role == Role.WEIGHT and t.numel == V * D for t in chunked.tensors) == 2  # W, W'


def _graph_values(model: onnx.ModelProto, train: TensorGraph, tokens: torch.Tensor,
                  labels: torch.Tensor) -> dict[int, torch.Tensor]:
    values = init_values(train)
    for tid, value in initializer_values(model, train).values.items():
        values[tid] = torch.from_numpy(value.copy())
    values[train.inputs[0]] = tokens
    meta = train.meta["training"]
    values[meta["labels"]] = labels.reshape(train.tensors[meta["labels"]].shape)
    return values


def _module_names(module: LM, model: onnx.ModelProto, graph: TensorGraph
                  ) -> dict[str, tuple[str, bool]]:
    """graph weight -> (module parameter, transposed?), by value (the module's values are
    distinct random numbers); a second graph tensor of one parameter (a file that unties the
    embedding) gets the module's new copy of it (`LM.untie`)."""
    found = initializer_values(model, graph).values
    params = dict(module.named_parameters())
    out: dict[str, tuple[str, bool]] = {}
    for tid, value in found.items():
        hits = [(n, flip) for n, p in params.items() for flip in (False, True)[:p.dim()]
                if (p.T if flip else p).shape == value.shape
                and np.array_equal((p.T if flip else p).detach().numpy(), value)]
        assert len(hits) == 1, (graph.tensors[tid].name, hits)
        out[graph.tensors[tid].name] = hits[0]
    taken = [n for n, _ in out.values()]
    if len(taken) != len(set(taken)):  # the file untied the embedding
        copy = module.untie()
        gather = {graph.tensors[k.inputs[0]].name for k in graph.kernels
                  if k.op_type == "Gather"}
        out = {g: ((copy, flip) if n == "emb.weight" and g not in gather else (n, flip))
               for g, (n, flip) in out.items()}
    return out


def _torch_steps(module: LM, tokens: torch.Tensor, labels: torch.Tensor
                 ) -> tuple[list[float], dict[str, torch.Tensor]]:
    opt = torch.optim.SGD(module.parameters(), lr=LR)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = F.cross_entropy(module(tokens).reshape(-1, V), labels.reshape(-1))
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses, {n: p.detach() for n, p in module.named_parameters()}


def test_chunked_steps_equal_the_plain_loss_and_torch(case):
    """2 SGD steps: the losses and every updated weight of the chunked graph against the
    plain graph's and against torch.autograd of the module (with its tie cut where the file
    cut it) on the file's weights."""
    _, _, _, module, tokens, model, graph = case
    labels = torch.randint(0, V, (B * L,), generator=torch.Generator().manual_seed(1))
    twin = _twin(module)
    names = _module_names(twin, model, graph)  # unties the twin where the file is untied
    want_losses, params = _torch_steps(twin, tokens, labels)
    runs = {}
    for chunks in (1, CHUNKS):
        train = _derive(graph, chunks)
        out = train_steps(train, STEPS, values=_graph_values(model, train, tokens, labels))
        meta = train.meta["training"]
        weights = {train.tensors[w].name for w, _ in meta["weight_grads"]}
        runs[chunks] = ([float(o[meta["loss"]]) for o in out],
                        {n: out[-1][train.by_name(f"{n}::next").id] for n in weights})
    (plain_losses, plain), (losses, chunked) = runs[1], runs[CHUNKS]
    assert set(plain) == set(chunked) == set(names)
    np.testing.assert_allclose(losses, plain_losses, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5, atol=1e-5)
    for name, (param, flip) in names.items():
        torch.testing.assert_close(chunked[name], plain[name], rtol=1e-5, atol=1e-5)
        want = params[param].T if flip else params[param]
        torch.testing.assert_close(chunked[name], want, rtol=1e-5, atol=1e-5)


def _twin(module: LM) -> LM:
    """A copy of the module with its values (and its tie, if any)."""
    twin = LM(module.form)
    twin.load_state_dict(module.state_dict())
    return twin


# ---- the other forms of logits ----------------------------------------------------------------
def test_a_gemm_classifier_chunks_and_trains_like_the_plain_loss():
    """A CNN's Gemm classifier (transB = 1, a bias) is a head too; its chunked loss trains
    like the plain one (3 SGD steps, every updated weight)."""
    forward = small_cnn()
    plain, chunked = derive_training(forward), derive_training(forward, loss_chunks=3)
    assert chunked.meta["training"]["head"]["op"] == "Gemm"
    values = init_values(plain)
    by_name = {plain.tensors[t].name: v for t, v in values.items()}
    ours = train_steps(chunked, 3, values={t.id: by_name[t.name] for t in chunked.tensors
                                           if t.producer is None})
    ref = train_steps(plain, 3, values=values)
    for w, _ in plain.meta["training"]["weight_grads"]:
        name = f"{plain.tensors[w].name}::next"
        torch.testing.assert_close(ours[-1][chunked.by_name(name).id],
                                   ref[-1][plain.by_name(name).id], rtol=1e-5, atol=1e-6)


def _net_head(kind: str) -> TensorGraph:
    """Rows through `kind`: forms of the output that are no head."""
    net = Net(kind)
    x = net.tensor((2, 3, 6), Role.INPUT, name="x")
    if kind == "activation":  # x @ relu(W): a product, but by no weight
        return net.build(net.op("MatMul", [x, net.op("Relu", [net.weight(6, 9)], (6, 9))],
                                (2, 3, 9)))
    rows = net.op("Reshape", [x], (6, 6), shape=(6, 6))
    attrs = {"gemm-transA": {"transA": 1}, "gemm-alpha": {"alpha": 2.0},
             "gemm-bias-per-row": {}}[kind]
    bias = net.weight(6, 9) if kind == "gemm-bias-per-row" else net.weight(9)
    return net.build(net.op("Gemm", [rows, net.weight(6, 9), bias], (6, 9), **attrs))


@pytest.mark.parametrize("kind, why", [
    ("activation", r"made by MatMul .* by 't\d+', made by Relu .*: a product by no weight"),
    ("gemm-transA", r"Gemm .* with transA = 1 .*nn\.Linear"),
    ("gemm-alpha", r"Gemm .* with alpha = 2\.0"),
    ("gemm-bias-per-row", r"Gemm .* whose C has shape \(6, 9\) \(not one value per class\)"),
])
def test_what_is_no_head_is_refused_naming_what_it_is(kind, why):
    with pytest.raises(ConfigError, match=why) as err:
        derive_training(_net_head(kind), loss="ce-last", loss_chunks=2)
    assert "--loss-chunks 1" in str(err.value)
    assert "head" not in derive_training(_net_head(kind), loss="ce-last").meta["training"]


def test_an_unfused_tied_head_names_the_fusion_pass():
    """--no-fuse keeps MatMul(X, Transpose(emb)): refused, saying that fusion makes it one."""
    _, _, model, _ = _case("tied", "capture")
    with pytest.raises(ConfigError, match=r"by the transpose of the weight 'emb\.weight', not "
                       "by a fused Linear layer: the fusion pass makes it one"):
        _derive(import_model(model, fuse=False), CHUNKS)
