"""Graphs the ONNX importer produces (the frontend's test models) train like torch.autograd:
3 SGD steps of the derived graph against autograd + torch.optim on its forward kernels."""

from __future__ import annotations

import pytest

from autotm_py.frontend.onnx import import_model, import_onnx
from tests.fixtures import onnx_models as M
from tests.test_training_ops import compare_training

FIXTURES = M.__file__.rsplit("/", 1)[0]


@pytest.mark.parametrize(("name", "kwargs"), [
    ("zoo9.onnx", {}),
    ("tiny_cnn_opset13.onnx", {"batch": 2}),
    ("tiny_gpt_opset17.onnx", {"dims": {"batch": 2, "seq": 4}}),
])
def test_committed_fixture_trains_like_autograd(name: str, kwargs: dict) -> None:
    graph = import_onnx(f"{FIXTURES}/{name}", **kwargs)
    train = compare_training(graph, steps=3)
    assert train.meta["training"]["weight_grads"]


def test_opset9_zoo_style_model_trains_like_autograd() -> None:
    """LRN, Sum, Dropout (now in training mode) and Resize from an opset-9 file."""
    train = compare_training(import_model(M.opset9_zoo()), steps=3, optimizer="adam")
    assert {"LRNGrad", "DropoutGrad", "ResizeGrad"} <= {k.op_type for k in train.kernels}


@pytest.mark.parametrize("opset", [11, 18])
def test_exported_decoder_trains_like_autograd(tmp_path, opset: int) -> None:
    """Pad, ConvTranspose, Clip, nearest and bilinear Resize as torch exports them."""
    graph = import_onnx(M.torch_decoder(tmp_path / "dec.onnx", opset), batch=2)
    compare_training(graph, steps=3)


@pytest.mark.parametrize(("opset", "mask"), [(11, "buffer"), (14, "tril")])
def test_exported_gpt_trains_like_autograd(tmp_path, opset: int, mask: str) -> None:
    path = M.torch_gpt(tmp_path / "gpt.onnx", opset, mask=mask, layers=1)
    train = compare_training(import_onnx(path, batch=2, dims={"seq": 5}), steps=3)
    assert "GradAccumulate" in {k.op_type for k in train.kernels}  # tied embedding
