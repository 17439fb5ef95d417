"""Models whose output is not logits (issue: acceptance item 2).

- a classifier that ends in Softmax or LogSoftmax trains on its logits: the derivation drops
  that kernel (directly, or seen through Reshape/Flatten, as old opsets lower Softmax over axis
  1), records it in meta["training"]["dropped_output"], and its SGD steps are torch's
  `F.cross_entropy` on the logits;
- a cross-entropy that would still read probabilities (a Softmax over another axis, rows
  regrouped by a Reshape, probabilities read by other kernels) is refused with the fix;
- `--loss mse` trains any float output: a scalar, (N,) and (N, 1), as torch's `F.mse_loss`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F

from autotm_py import api
from autotm_py.cli import main
from autotm_py.errors import ConfigError
from autotm_py.frontend.onnx import import_model
from autotm_py.ir import TensorGraph
from autotm_py.runtime.reference import init_values, train_steps
from tests.fixtures.onnx_models import F32, const, inp, make, node
from tests.fixtures.onnx_models import init as initializer

N, FEATURES, CLASSES, LR, STEPS = 4, 6, 5, 0.1, 3
RNG = np.random.default_rng(0)

# a reference step: (weights by ONNX name, input, label) -> loss
LossFn = Callable[[dict[str, torch.Tensor], torch.Tensor, torch.Tensor], torch.Tensor]


def _gemm(out: str = "logits", classes: int = CLASSES) -> tuple[onnx.NodeProto,
                                                                list[onnx.TensorProto]]:
    """x (N, FEATURES) -> Gemm with a transposed weight and a bias -> `out` (N, classes)."""
    inits = [initializer("fc.W", RNG.standard_normal((classes, FEATURES))),
             initializer("fc.B", RNG.standard_normal(classes))]
    return node("Gemm", ["x", "fc.W", "fc.B"], [out], transB=1), inits


def classifier(head: Sequence[onnx.NodeProto], opset: int = 17,
               classes: int = CLASSES) -> TensorGraph:
    """Gemm logits then `head` (nodes from "logits" to "y"), imported as our importer does."""
    gemm, inits = _gemm(classes=classes)
    model = make([gemm, *head], [inp("x", [N, FEATURES])], ["y"], inits, opset=opset,
                 name="clf")
    return import_model(model)


def steps_against_torch(graph: TensorGraph, loss_fn: LossFn, *, loss: str = "auto",
                        steps: int = STEPS) -> TensorGraph:
    """Derive SGD training, run `steps` iterations with our reference runner and the same
    steps with torch.autograd on `loss_fn` (torch.optim.SGD, the same initial values): the
    losses and the final weights agree to float32 rounding."""
    train = api.derive_training(graph, loss=loss, learning_rate=LR)
    meta = train.meta["training"]
    values = init_values(train, seed=0)
    weights = {w: train.name_of(w) for w, _ in meta["weight_grads"]}
    updated = dict(train.carried)  # W -> W'
    ours = train_steps(train, steps, values=values, keep=list(updated.values()))
    params = {name: values[w].clone().requires_grad_(True) for w, name in weights.items()}
    opt = torch.optim.SGD(list(params.values()), lr=LR, foreach=False)
    x, label = values[train.by_name("x").id], values[meta["labels"]]
    for step in range(steps):
        opt.zero_grad()
        ref = loss_fn(params, x, label)
        ref.backward()
        opt.step()
        _close(ours[step][meta["loss"]], ref.detach(), f"loss at step {step}")
    for w, name in weights.items():
        _close(ours[-1][updated[w]], params[name].detach(), f"{name} after {steps} steps")
    return train


def _close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Float32 rounding only: both sides run the same math in another arrangement."""
    assert got.shape == want.shape, (what, got.shape, want.shape)
    err = float((got - want).abs().max()) if want.numel() else 0.0
    assert err <= 1e-6 * max(1.0, float(want.abs().max())), f"{what}: error {err:.3g}"


def _linear(p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    return x @ p["fc.W"].T + p["fc.B"]


def _ce(p: dict[str, torch.Tensor], x: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(_linear(p, x), label)


def ops(graph: TensorGraph) -> list[str]:
    return [k.op_type for k in graph.kernels]


# ---- (a), (b) a final Softmax / LogSoftmax is dropped ---------------------------------------
@pytest.mark.parametrize(("op", "opset", "axis"), [
    ("Softmax", 17, {}),                  # opset 13+: last axis by default
    ("Softmax", 11, {}),                  # before 13: axis 1 of a 2-d input (the same)
    ("Softmax", 17, {"axis": 1}),
    ("LogSoftmax", 17, {}),
    ("LogSoftmax", 9, {"axis": 1}),
])
def test_final_softmax_is_dropped_and_trains_on_logits(op, opset, axis):
    graph = classifier([node(op, ["logits"], ["y"], **axis)], opset)
    assert op in ops(graph)
    train = steps_against_torch(graph, _ce)
    meta = train.meta["training"]
    assert op not in ops(train) and f"{op}Grad" not in ops(train)
    assert meta["dropped_output"] == {"op": op, "name": "y_node", "logits": "logits"}
    loss = train.kernels[meta["loss_kernel"]]
    assert (loss.op_type, train.name_of(loss.inputs[0])) == ("SoftmaxCrossEntropy", "logits")
    assert train.tensors[meta["labels"]].shape == (N,)
    # the forward kernels before the softmax keep their ids and names
    assert [k.name for k in train.kernels[:len(graph.kernels) - 1]] == \
        [k.name for k in graph.kernels[:-1]]


def test_explicit_cross_entropy_drops_it_too_and_logits_are_not_refused():
    graph = classifier([node("Softmax", ["logits"], ["y"])])
    for loss in ("ce-axis1", "ce-last"):
        assert "dropped_output" in steps_against_torch(graph, _ce, loss=loss).meta["training"]
    plain = classifier([node("Identity", ["logits"], ["y"])])
    assert "dropped_output" not in steps_against_torch(plain, _ce).meta["training"]


def test_chunked_loss_on_a_dropped_softmax():
    """--loss-chunks replaces the fused Linear that makes the logits; the Softmax that read
    them is gone, so nothing else reads them."""
    nodes = [node("MatMul", ["x", "w"], ["z"]), node("Add", ["z", "b"], ["logits"]),
             node("Softmax", ["logits"], ["y"])]
    inits = [initializer("w", RNG.standard_normal((4, 7))),
             initializer("b", RNG.standard_normal(7))]
    graph = import_model(make(nodes, [inp("x", [2, 3, 4])], ["y"], inits, name="lm"))
    assert "Linear" in ops(graph)
    train = api.derive_training(graph, loss_chunks=2)
    assert "LinearCrossEntropy" in ops(train) and "Softmax" not in ops(train)
    assert train.meta["training"]["dropped_output"]["op"] == "Softmax"


# ---- (d) seen through shape-only ops -----------------------------------------------------------
def pooled_head(opset: int, tail: Sequence[onnx.NodeProto] = ()) -> TensorGraph:
    """A 1x1 convolution and a global average pool: N x C x 1 x 1 scores, then a Softmax over
    axis 1 (before opset 13 the importer lowers it to Reshape -> Softmax -> Reshape), then
    `tail` (nodes from "p" to "y")."""
    nodes = [node("Conv", ["x", "conv.W", "conv.B"], ["c"]),
             node("GlobalAveragePool", ["c"], ["s"]),
             node("Softmax", ["s"], ["p" if tail else "y"], axis=1), *tail]
    inits = [initializer("conv.W", RNG.standard_normal((CLASSES, 3, 1, 1))),
             initializer("conv.B", RNG.standard_normal(CLASSES))]
    model = make(nodes, [inp("x", [N, 3, 4, 4])], ["y"], inits, opset=opset, name="pooled")
    return import_model(model)


def _pooled_ce(p: dict[str, torch.Tensor], x: torch.Tensor, label: torch.Tensor
               ) -> torch.Tensor:
    scores = F.conv2d(x, p["conv.W"], p["conv.B"]).mean(dim=(2, 3))
    return F.cross_entropy(scores, label)


@pytest.mark.parametrize(("opset", "tail", "out_shape"), [
    (11, [], (N, CLASSES, 1, 1)),          # Reshape -> Softmax -> Reshape (the zoo's opset 9-12)
    (17, [], (N, CLASSES, 1, 1)),          # a 4-d softmax over axis 1
    (17, [node("Flatten", ["p"], ["y"])], (N, CLASSES)),
    (17, [const("sq", [2, 3]), node("Squeeze", ["p", "sq"], ["y"])], (N, CLASSES)),
    (11, [node("Flatten", ["p"], ["f"]), node("Identity", ["f"], ["y"])], (N, CLASSES)),
])
def test_softmax_seen_through_shape_ops(opset, tail, out_shape):
    graph = pooled_head(opset, tail)
    assert graph.tensors[graph.outputs[0]].shape == out_shape
    train = steps_against_torch(graph, _pooled_ce)
    meta = train.meta["training"]
    assert "Softmax" not in ops(train) and meta["dropped_output"]["op"] == "Softmax"
    assert train.tensors[meta["labels"]].shape == (N,)
    loss = train.kernels[meta["loss_kernel"]]
    assert train.tensors[loss.inputs[0]].shape == out_shape  # the output, now of logits


def _pixel_ce(p: dict[str, torch.Tensor], x: torch.Tensor, label: torch.Tensor
              ) -> torch.Tensor:
    return F.cross_entropy(F.conv2d(x, p["conv.W"], p["conv.B"]), label)


@pytest.mark.parametrize(("perm_back", "dropped"), [((0, 3, 2, 1), True),
                                                     ((0, 2, 3, 1), False)])
def test_softmax_seen_through_transposes(perm_back, dropped):
    """torch's exporter before opset 13 writes a softmax over axis 1 as Transpose -> Softmax
    over the last axis -> Transpose back: dropped (here per pixel, N x C x H x W). Transposed
    back elsewhere (N x H x C x W), the loss's class axis 1 is not the softmax's: refused."""
    nodes = [node("Conv", ["x", "conv.W", "conv.B"], ["c"]),
             node("Transpose", ["c"], ["t"], perm=[0, 3, 2, 1]),
             node("Softmax", ["t"], ["p"], axis=3),
             node("Transpose", ["p"], ["y"], perm=list(perm_back))]
    inits = [initializer("conv.W", RNG.standard_normal((CLASSES, 3, 1, 1))),
             initializer("conv.B", RNG.standard_normal(CLASSES))]
    graph = import_model(make(nodes, [inp("x", [N, 3, 4, 4])], ["y"], inits, opset=17,
                              name="transposed"))
    if dropped:
        train = steps_against_torch(graph, _pixel_ce)
        assert "Softmax" not in ops(train) and ops(train).count("Transpose") == 2
        assert train.meta["training"]["dropped_output"]["logits"] == "t"
        assert train.tensors[train.meta["training"]["labels"]].shape == (N, 4, 4)
        return
    with pytest.raises(ConfigError, match=r"of shape 4x4x5x4 .*over axis 3 of 't' \(shape "
                                          r"4x4x4x5\), not over the loss's class axis 1;"):
        api.derive_training(graph)


@pytest.mark.parametrize("opset", [9, 12, 17])
def test_torch_exported_pooled_softmax_head(opset, tmp_path):
    """The light models' SqueezeNet stand-in, Softmax over axis 1 of N x C x 1 x 1 exported by
    torch (Transposes around it before opset 13): trained on its logits, like autograd."""
    from tests.fixtures.light_models import squeezenet_like
    from tests.test_training_ops import compare_training

    graph = api.import_onnx(squeezenet_like(tmp_path / f"s{opset}.onnx", opset), batch=2)
    train = compare_training(graph, steps=2)
    meta = train.meta["training"]
    assert "Softmax" not in ops(train) and meta["dropped_output"]["op"] == "Softmax"
    assert train.tensors[meta["labels"]].shape == (2,)


# ---- (c), (d) refusals -------------------------------------------------------------------------
def test_softmax_over_another_axis_is_refused_with_the_fix():
    graph = classifier([node("Softmax", ["logits"], ["y"], axis=0)])
    with pytest.raises(ConfigError) as err:
        api.derive_training(graph, loss="ce-axis1")
    message = str(err.value)
    assert "\n" not in message
    assert "output 'y' of shape 4x5 (--loss ce-axis1)" in message
    assert "Softmax 'y_node' over axis 0 of 'logits' (shape 4x5)" in message
    assert "not over the loss's class axis 1" in message
    assert "export the model without its final Softmax, or use --loss mse" in message
    # mse on probabilities is a loss (the Brier score): the Softmax stays and trains
    train = api.derive_training(graph, loss="mse")
    assert "Softmax" in ops(train) and "SoftmaxGrad" in ops(train)
    assert "dropped_output" not in train.meta["training"]


def test_refusal_names_the_loss_whose_axis_is_the_softmax():
    """(N, T, V) with a Softmax over axis 1: auto's class axis is the last; ce-axis1 fits."""
    model = make([node("MatMul", ["x", "w"], ["logits"]),
                  node("Softmax", ["logits"], ["y"], axis=1)],
                 [inp("x", [2, 3, 4])], ["y"],
                 [initializer("w", RNG.standard_normal((4, 7)))], name="seq")
    graph = import_model(model)
    with pytest.raises(ConfigError, match=r"over axis 1 of 'logits' \(shape 2x3x7\).*use "
                                          r"--loss ce-axis1 \(classes on the Softmax's axis\)"):
        api.derive_training(graph)
    train = api.derive_training(graph, loss="ce-axis1")
    assert "Softmax" not in ops(train)
    assert train.tensors[train.meta["training"]["labels"]].shape == (2, 7)


def test_rows_regrouped_by_a_reshape_are_refused():
    """Softmax over rows of 5, reshaped to rows of 10: the loss's rows are not the softmax's."""
    head = [node("Softmax", ["logits"], ["p"]), node("Reshape", ["p", "shape"], ["y"])]
    shape = initializer("shape", [N // 2, 2 * CLASSES], np.int64)
    gemm, inits = _gemm()
    graph = import_model(make([gemm, *head], [inp("x", [N, FEATURES])], ["y"], [*inits, shape],
                              name="regrouped"))
    with pytest.raises(ConfigError, match=r"of shape 2x10 .*over axis 1 of 'logits' \(shape "
                                          r"4x5\), not over the loss's class axis 1"):
        api.derive_training(graph)
    # a LogSoftmax there stays: cross-entropy on log-probabilities is an NLL, not a mistake
    head[0] = node("LogSoftmax", ["logits"], ["p"])
    graph = import_model(make([gemm, *head], [inp("x", [N, FEATURES])], ["y"],
                              [*inits, shape], name="regrouped_log"))
    train = api.derive_training(graph)
    assert "LogSoftmax" in ops(train) and "dropped_output" not in train.meta["training"]


def test_probabilities_read_by_other_kernels_are_refused():
    """The Softmax's output also feeds another output: dropping it would change that one."""
    gemm, inits = _gemm()
    nodes = [gemm, node("Softmax", ["logits"], ["y"]), node("Mul", ["y", "y"], ["sq"])]
    graph = import_model(make(nodes, [inp("x", [N, FEATURES])], ["y", "sq"], inits,
                              name="shared"))
    with pytest.raises(ConfigError, match="Softmax 'y_node' which other kernels also read, so "
                                          "it cannot be dropped"):
        api.derive_training(graph)
    assert "Softmax" in ops(api.derive_training(graph, loss="mse"))


# ---- (e) mse on any float output ---------------------------------------------------------------
def regression(shape: str) -> TensorGraph:
    """Gemm to one column (N, 1), then squeezed to (N,) or reduced to a scalar."""
    gemm, inits = _gemm("col", classes=1)
    nodes = [gemm]
    if shape == "N1":
        nodes.append(node("Identity", ["col"], ["y"]))
    elif shape == "N":
        nodes.append(node("Reshape", ["col", "flat"], ["y"]))
        inits.append(initializer("flat", [N], np.int64))
    else:
        nodes.append(node("ReduceMean", ["col"], ["y"], keepdims=0))
    out = onnx.helper.make_tensor_value_info("y", F32, None)
    return import_model(make(nodes, [inp("x", [N, FEATURES])], [out], inits, opset=17,
                             name=f"reg_{shape}"))


def _mse_ref(shape: str) -> LossFn:
    def loss(p: dict[str, torch.Tensor], x: torch.Tensor, target: torch.Tensor
             ) -> torch.Tensor:
        col = x @ p["fc.W"].T + p["fc.B"]
        pred = {"N1": col, "N": col.reshape(N), "scalar": col.mean()}[shape]
        return F.mse_loss(pred, target)
    return loss


@pytest.mark.parametrize(("shape", "dims"), [("scalar", ()), ("N", (N,)), ("N1", (N, 1))])
def test_mse_trains_any_float_output(shape, dims):
    graph = regression(shape)
    assert graph.tensors[graph.outputs[0]].shape == dims
    train = steps_against_torch(graph, _mse_ref(shape), loss="mse")
    meta = train.meta["training"]
    target = train.tensors[meta["labels"]]
    assert (target.name, target.shape, target.dtype) == ("targets", dims, "float32")
    assert {"MeanSquaredError", "MeanSquaredErrorGrad"} <= set(ops(train))
    if shape in ("scalar", "N"):  # no class axis: cross-entropy is refused, naming mse
        with pytest.raises(ConfigError, match="it has no class axis; use --loss mse"):
            api.derive_training(graph)


# ---- the faces ---------------------------------------------------------------------------------
def test_inspect_says_the_softmax_was_dropped(tmp_path, capsys):
    gemm, inits = _gemm()
    path = tmp_path / "clf.onnx"
    onnx.save(make([gemm, node("Softmax", ["logits"], ["y"])], [inp("x", ["N", FEATURES])],
                   ["y"], inits, name="clf"), path)
    assert main(["inspect", str(path), "--batch", "4", "--training"]) == 0
    out = capsys.readouterr().out
    assert out.count("final Softmax 'y_node' dropped") == 1
    assert main(["inspect", str(path), "--batch", "4", "--training", "--json"]) == 0
    assert '"dropped_output"' in capsys.readouterr().out
    assert main(["inspect", str(path), "--batch", "4"]) == 0
    assert "dropped" not in capsys.readouterr().out
