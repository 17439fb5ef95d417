"""The loss that `derive_training` appends (issue 17, item 3): picked from the output's shape
or by `--loss`, never a constant loss whose gradients are all zero.

- `choose_loss` on the shapes of the docs' table, and its refusals;
- every zoo model: d loss / d output is non-zero in every row of the real derived loss, and one
  training step gives every trained weight a non-zero gradient;
- stand-ins for the onnx zoo's light models (N x C x 1 x 1 heads, a UNet, a 1-d tagger),
  exported from torch and imported: same checks, plus 2 SGD steps against torch.autograd;
- a UNet's training graph plans and simulates; the CLI's `--loss`.
"""

from __future__ import annotations

import pytest
import torch

from autotm_py import api
from autotm_py.cli import main
from autotm_py.config import PlanConfig
from autotm_py.errors import ConfigError
from autotm_py.frontend.zoo import ZOO, build_graph, dlrm
from autotm_py.ir import GraphBuilder, Role, TensorGraph
from autotm_py.ir.loss import LOSSES, choose_loss
from autotm_py.kernels import run_kernel
from autotm_py.runtime.reference import init_values, train_steps
from tests.fixtures.light_models import LIGHT_MODELS, squeezenet_like, unet_like
from tests.test_training_ops import compare_training


# ---- the choice -----------------------------------------------------------------------------
@pytest.mark.parametrize(("loss", "shape", "producer", "axis", "labels"), [
    ("auto", (4, 10), "Gemm", -1, (4,)),                      # classifier
    ("auto", (4, 8, 50), "MatMul", -1, (4, 8)),               # language model
    ("auto", (4, 5, 7), "Conv", 1, (4, 7)),                   # 1-d conv tagger
    ("auto", (4, 10, 1, 1), "GlobalAveragePool", 1, (4,)),    # SqueezeNet/DenseNet head
    ("auto", (4, 3, 16, 16), "Conv", 1, (4, 16, 16)),         # segmentation
    ("auto", (4, 3, 1, 16), "Conv", 1, (4, 1, 16)),           # only trailing 1s are dropped
    ("auto", (1, 10, 1, 1), "Softmax", 1, (1,)),              # batch 1 stays
    ("ce-axis1", (4, 10), "Gemm", -1, (4,)),                  # axis 1 is the last: same kernel
    ("ce-axis1", (4, 8, 50), "MatMul", 1, (4, 50)),
    ("ce-last", (4, 3, 16, 16), "Conv", -1, (4, 3, 16)),      # channels-last images
])
def test_loss_follows_the_output_shape(loss, shape, producer, axis, labels):
    spec = choose_loss(loss, "y", shape, "float32", producer)
    assert spec.op_type == "SoftmaxCrossEntropy"
    assert spec.attrs == {"axis": axis, "reduction": "mean", "ignore_index": None}
    assert (spec.labels_shape, spec.labels_dtype) == (labels, "int64")


def test_mse_takes_a_target_of_the_output_shape():
    spec = choose_loss("mse", "y", (4, 1), "float16")
    assert (spec.op_type, spec.labels_shape, spec.labels_dtype) == ("MeanSquaredError",
                                                                    (4, 1), "float16")


@pytest.mark.parametrize(("loss", "shape", "fix"), [
    ("auto", (4,), "--loss mse"),
    ("auto", (4, 1), "--loss mse"),               # a click score
    ("auto", (4, 1, 8, 8), "--loss ce-axis1"),     # a one-channel mask
    ("auto", (4, 1, 1, 1), "--loss mse"),
    ("auto", (4, 8, 1), "--loss ce-last"),         # per-position scalars (or N x C x 1)
    ("ce-last", (4, 10, 1, 1), "--loss mse"),      # the old rule on a pooled head
    ("ce-axis1", (4, 1, 5), "--loss mse"),
])
def test_no_meaningful_class_axis_is_refused(loss, shape, fix):
    with pytest.raises(ConfigError) as err:
        choose_loss(loss, "scores", shape, "float32", "MatMul")
    message = str(err.value)
    dims = "x".join(map(str, shape))
    assert "\n" not in message
    assert f"output 'scores' of shape {dims}" in message and fix in message


def test_unknown_loss_and_explicit_loss_on_a_graph_with_its_own():
    graph = _tiny("pooled", (2, 4, 1, 1))
    with pytest.raises(ConfigError, match="loss 'hinge' is not supported"):
        api.derive_training(graph, loss="hinge")
    b = GraphBuilder("own_loss")
    x = b.add_tensor("x", (3, 5), "float32", Role.WEIGHT)
    y = b.add_tensor("y", (3,), "int64", Role.INPUT)
    loss = b.add_tensor("l", (), "float32", Role.OUTPUT)
    b.add_kernel("SoftmaxCrossEntropyLoss", [x, y], [loss], name="ce",
                 attrs={"reduction": "mean"})
    b.inputs, b.outputs = [y], [loss]
    own = b.build()
    assert api.derive_training(own).meta["training"]["loss"] == loss
    with pytest.raises(ConfigError, match="has its own loss"):
        api.derive_training(own, loss="mse")
    with pytest.raises(ConfigError, match="--loss-chunks 4 applies only"):
        api.derive_training(own, loss_chunks=4)
    assert set(LOSSES) == {"auto", "ce-axis1", "ce-last", "mse"}


def _tiny(name: str, shape: tuple[int, ...]) -> TensorGraph:
    """A weight times an input, of `shape`: the smallest trainable graph with that output."""
    b = GraphBuilder(name)
    x = b.add_tensor("x", shape, "float32", Role.INPUT)
    w = b.add_tensor("w", shape, "float32", Role.WEIGHT)
    y = b.add_tensor("y", shape, "float32", Role.OUTPUT)
    b.add_kernel("Mul", [x, w], [y])
    b.inputs, b.outputs = [x], [y]
    return b.build()


# ---- checks on a derived graph ----------------------------------------------------------------
def _loss_gradient_rows(train: TensorGraph, seed: int = 0) -> torch.Tensor:
    """d loss / d output of the derived loss kernel on random scores, as (rows, classes) or
    (elements,): run the loss kernel under autograd on the real kernel and labels."""
    meta = train.meta["training"]
    kernel = train.kernels[meta["loss_kernel"]]
    values = init_values(train, seed)
    out = train.tensors[kernel.inputs[0]]
    scores = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed),
                         requires_grad=True)
    loss = run_kernel(kernel, [scores, values[meta["labels"]]])[0]
    (grad,) = torch.autograd.grad(loss, scores)
    if kernel.op_type != "SoftmaxCrossEntropy":
        return grad.reshape(-1)
    axis = int(kernel.attr("axis")) % grad.dim()
    return grad.movedim(axis, -1).reshape(-1, grad.shape[axis])


def assert_gradients_nonzero(train: TensorGraph, seed: int = 0) -> None:
    """One SGD step: the loss is finite and every trained weight's gradient is non-zero."""
    meta = train.meta["training"]
    grads = dict(meta["weight_grads"])
    assert grads, f"{train.name}: nothing is trained"
    out = train_steps(train, 1, seed, keep=grads.values())[0]
    assert torch.isfinite(out[meta["loss"]]), train.name
    zero = [train.name_of(w) for w, g in grads.items() if not bool(out[g].abs().max() > 0)]
    assert not zero, f"{train.name}: all-zero gradients of {zero[:5]} ({len(zero)})"


# ---- the zoo ----------------------------------------------------------------------------------
def _zoo(name: str, batch: int = 2) -> TensorGraph:
    return build_graph(name, batch=batch, dims={"seq": 8} if ZOO[name].is_sequence else None)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_loss_gradient_is_nonzero_in_every_row(name):
    train = api.derive_training(_zoo(name))
    rows = _loss_gradient_rows(train)
    assert rows.dim() == 2 and rows.shape[1] >= 2
    assert bool((rows.abs().amax(dim=1) > 0).all()), name


@pytest.fixture
def small_dlrm(monkeypatch):
    """DLRM's structure with 26 tables of 50-500 rows (the Kaggle ones are 2 GB)."""
    monkeypatch.setattr(dlrm, "KAGGLE_TABLES", tuple(50 + 17 * i for i in range(26)))


# VGG416 is VGG19's layer repeated 400 times (a step takes a minute and 9 GB here).
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(ZOO) - {"vgg416"}))
def test_zoo_model_step_gives_every_weight_a_gradient(name, small_dlrm):
    assert_gradients_nonzero(api.derive_training(_zoo(name, batch=1)))


# ---- stand-ins for the onnx zoo's light models ----------------------------------------------
LIGHT_LOSS = {  # model -> (loss axis, labels shape at batch 2)
    "squeezenet_like": (1, (2,)),
    "densenet_like": (1, (2,)),
    "unet_like": (1, (2, 16, 16)),
    "tagger_1d": (1, (2, 12)),
}


@pytest.fixture(scope="module")
def light_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("light")


@pytest.mark.parametrize("name", sorted(LIGHT_MODELS))
def test_light_model_trains_with_nonzero_gradients(name, light_dir):
    path = LIGHT_MODELS[name](light_dir / f"{name}.onnx")
    graph = api.import_onnx(path, batch=2)
    train = api.load_model(path, batch=2, training=True)
    meta = train.meta["training"]
    axis, labels = LIGHT_LOSS[name]
    assert train.kernels[meta["loss_kernel"]].attr("axis") == axis
    assert train.tensors[meta["labels"]].shape == labels
    assert bool((_loss_gradient_rows(train).abs().amax(dim=1) > 0).all())
    assert_gradients_nonzero(train)
    compare_training(graph, steps=2)


def test_old_rule_on_a_pooled_head_was_degenerate(light_dir):
    """What issue 17 saw: softmax over the last axis of N x C x 1 x 1 is constant; --loss
    ce-last now refuses it instead of training nothing."""
    path = squeezenet_like(light_dir / "squeeze_plain.onnx", softmax=False)
    graph = api.import_onnx(path, batch=2)
    with pytest.raises(ConfigError, match=r"output '.*' of shape 2x10x1x1 .*size 1"):
        api.derive_training(graph, loss="ce-last")
    scores = torch.randn(2, 10, 1, 1, requires_grad=True)
    log_prob = torch.log_softmax(scores, -1)  # the old loss
    (grad,) = torch.autograd.grad(-log_prob.sum(), scores)
    assert float(grad.abs().max()) == 0.0


def test_single_channel_mask_needs_mse(light_dir):
    path = unet_like(light_dir / "mask.onnx", classes=1)
    with pytest.raises(ConfigError, match=r"shape 2x1x16x16 .*--loss mse"):
        api.load_model(path, batch=2, training=True)
    train = api.load_model(path, batch=2, training=True, loss="mse")
    target = train.tensors[train.meta["training"]["labels"]]
    assert (target.name, target.shape, target.dtype, target.role) == (
        "targets", (2, 1, 16, 16), "float32", Role.LABEL)
    assert bool((_loss_gradient_rows(train) != 0).all())
    assert_gradients_nonzero(train)
    compare_training(api.import_onnx(path, batch=2), steps=2, loss="mse")


def test_unet_training_plan_verifies(light_dir):
    path = unet_like(light_dir / "unet_plan.onnx")
    train = api.load_model(path, batch=2, training=True)
    costs = api.load_costs(train, device="cpu")
    config = PlanConfig(strategy="sync", device="cpu", solver="highs").with_ratio("1:1")
    result = api.optimize(train, config, costs=costs)
    assert result.status == "optimal" and result.plan is not None, result.message
    sim = api.simulate(train, result.plan, costs=costs, strict=True)
    assert sim.total_s == pytest.approx(result.predicted_time_s, rel=1e-6)


# ---- the CLI ----------------------------------------------------------------------------------
def test_cli_loss_option(light_dir, capsys):
    path = unet_like(light_dir / "cli_mask.onnx", classes=1)
    assert main(["inspect", str(path), "--batch", "2", "--training"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot put a softmax cross-entropy loss on output")
    assert "--loss mse" in err and len(err.strip().splitlines()) == 1
    assert main(["inspect", str(path), "--batch", "2", "--training", "--loss", "mse",
                 "--json"]) == 0
    assert "MeanSquaredErrorGrad" in capsys.readouterr().out
