"""`autotm train MODEL.onnx --data FILE.npz`: an ONNX file's own weights trained on arrays under a
plan, written back into a copy of the file; and `autotm run MODEL.onnx` computing with the
file's weights. The trained initializers equal plain PyTorch's training of the module the
file was exported from (same batches, same SGD), within a relative 1e-5."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import numpy_helper

from autotm_py.cli import main
from autotm_py.frontend.capture import capture_module
from tests.test_trainer import MLP

BATCH, SAMPLES, STEPS = 256, 768, 5


@pytest.fixture()
def exported(tmp_path):
    """An MLP's ONNX file (weights inline), its module, and an .npz of 3 batches."""
    torch.manual_seed(3)
    module = MLP()
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(SAMPLES, 32, generator=gen)
    y = torch.randint(0, 10, (SAMPLES,), generator=gen)
    captured = capture_module(module, (x[:BATCH],))
    path = tmp_path / "mlp.onnx"
    onnx.save(captured.model, str(path))
    data = tmp_path / "data.npz"
    np.savez(data, **{captured.inputs[0]: x.numpy(), "labels": y.numpy()})
    return path, module, data, (x, y)


def test_train_writes_the_weights_plain_pytorch_trains(exported, tmp_path, capsys):
    path, module, data, (x, y) = exported
    out = tmp_path / "trained.onnx"
    code = main(["train", str(path), "--data", str(data), "--steps", str(STEPS), "--lr", "0.05",
                 "--momentum", "0.9", "--ratio", "2:1", "--device", "cpu", "-o", str(out),
                 "--plans", str(tmp_path / "plans"), "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["moves"] + report["recomputes"] > 0 and report["batch"] == BATCH
    assert report["precision"] == "fp32"  # auto on the CPU
    opt = torch.optim.SGD(module.parameters(), lr=0.05, momentum=0.9)
    want = []
    for step in range(STEPS):  # the batches in order, again from the start after the last
        start = (step % (SAMPLES // BATCH)) * BATCH
        opt.zero_grad()
        loss = F.cross_entropy(module(x[start:start + BATCH]), y[start:start + BATCH])
        loss.backward()
        opt.step()
        want.append(float(loss.detach()))
    assert np.allclose(report["losses"], want, rtol=1e-5)
    trained = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(out)).graph.initializer}
    for name, param in module.named_parameters():
        assert np.allclose(trained[name], param.detach().numpy(), rtol=1e-5, atol=1e-7), name


def test_train_in_bf16_follows_autocast_and_writes_fp32_weights(exported, tmp_path, capsys):
    """--precision bf16: the steps as torch.autocast(bfloat16) runs them (losses within 2e-2
    relative, docs/precision.md), the trained file's weights fp32 masters."""
    path, module, data, (x, y) = exported
    out = tmp_path / "trained.onnx"
    code = main(["train", str(path), "--data", str(data), "--steps", "3", "--lr", "0.05",
                 "--ratio", "2:1", "--device", "cpu", "--precision", "bf16", "-o", str(out),
                 "--plans", str(tmp_path / "plans"), "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["precision"] == "bf16"
    opt = torch.optim.SGD(module.parameters(), lr=0.05)
    want = []
    for step in range(3):
        start = step * BATCH
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(module(x[start:start + BATCH]), y[start:start + BATCH])
        loss.backward()
        opt.step()
        want.append(float(loss.detach()))
    assert np.allclose(report["losses"], want, rtol=2e-2), (report["losses"], want)
    trained = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(out)).graph.initializer}
    for name, param in module.named_parameters():
        assert trained[name].dtype == np.float32, name
        assert np.allclose(trained[name], param.detach().numpy(), rtol=2e-2, atol=1e-3), name


def test_run_computes_with_the_files_weights(exported, tmp_path, capsys):
    path, _, _, _ = exported
    plan = tmp_path / "plan.json"
    assert main(["optimize", str(path), "--training", "--ratio", "1:0", "--no-baselines",
                 "-o", str(plan)]) == 0
    capsys.readouterr()
    assert main(["run", str(path), "--plan", str(plan), "--device", "cpu", "--iterations", "1",
                 "--warmup", "0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["weights"].startswith("the file's own weights")
    assert main(["run", str(path), "--plan", str(plan), "--device", "cpu", "--iterations", "1",
                 "--warmup", "0", "--random-weights", "--json"]) == 0
    assert "--random-weights" in json.loads(capsys.readouterr().out)["weights"]


def test_bad_data_is_a_one_line_error(exported, tmp_path, capsys):
    path, _, _, (x, _) = exported
    bad = tmp_path / "bad.npz"
    np.savez(bad, x=x.numpy())
    code = main(["train", str(path), "--data", str(bad), "--steps", "1", "--device", "cpu",
                 "-o", str(tmp_path / "t.onnx")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1 and "labels" in err[0], err
    assert not (tmp_path / "t.onnx").exists()
