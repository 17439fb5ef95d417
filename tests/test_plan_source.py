"""A plan records the model it was made for (`PlanHeader.source`: an ONNX file's absolute path
or a zoo name), so `simulate`, `run` and `report --simulate` need no MODEL."""

from __future__ import annotations

import shutil

from autotm_py.cli import main
from autotm_py.plan import Plan

FIXTURE = "tests/fixtures/tiny_cnn_opset13.onnx"


def optimize(model: str, plan, ratio: str, *extra: str, batch: int = 2) -> None:
    assert main(["optimize", model, "--batch", str(batch), "--training", "--ratio", ratio,
                 "--no-baselines", "-o", str(plan), *extra]) == 0


def test_simulate_and_report_take_the_model_from_the_plan(tmp_path, capsys):
    onnx = tmp_path / "cnn.onnx"
    shutil.copy(FIXTURE, onnx)
    plan = tmp_path / "plan.json"
    optimize(str(onnx), plan, "1:0")
    assert Plan.load(plan).header.source == str(onnx.resolve())
    capsys.readouterr()
    assert main(["simulate", "--plan", str(plan)]) == 0
    assert "predicted" in capsys.readouterr().out
    assert main(["report", str(plan), "--simulate", "-o", str(tmp_path / "rep"),
                 "--format", "png"]) == 0
    assert "timeline simulated" in capsys.readouterr().out
    onnx.unlink()  # the plan's model moved away: one line that says so and what to do
    assert main(["simulate", "--plan", str(plan)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: the plan was made for {onnx.resolve()}, which is not there")
    assert "MODEL --plan PLAN" in err and len(err.splitlines()) == 1


def test_a_zoo_plan_records_the_zoo_name(tmp_path):
    plan = tmp_path / "plan.json"
    optimize("resnet50", plan, "1:1", "--time-limit", "60")
    assert Plan.load(plan).header.source == "resnet50"
    assert main(["simulate", "--plan", str(plan)]) == 0


def test_host_mode_outputs_say_the_slow_tier_is_simulated(tmp_path, capsys):
    """Host mode models a slow tier (Optane by default) this machine does not have: the plan's
    notes and a CPU run of it say so, and a GPU-mode plan run on the CPU says what it checks."""
    plan, gpu_plan = tmp_path / "host.json", tmp_path / "gpu.json"
    assert main(["optimize", FIXTURE, "--batch", "2", "--training", "--ratio", "1:1",
                 "--device", "cpu", "--no-baselines", "-o", str(plan)]) == 0
    assert ("note       host mode: the slow tier (optane) is simulated from the optane "
            "preset's bandwidths") in capsys.readouterr().out
    run = ["--device", "cpu", "--iterations", "1", "--warmup", "0"]
    assert main(["run", "--plan", str(plan), *run]) == 0
    assert "note: the plan's slow tier (optane) is simulated" in capsys.readouterr().out
    optimize(FIXTURE, gpu_plan, "1:0")
    capsys.readouterr()
    assert main(["run", "--plan", str(gpu_plan), *run]) == 0
    assert "note: a GPU-mode plan run on the CPU" in capsys.readouterr().out


def test_optimize_and_simulate_say_the_same_recomputed_time(tmp_path, capsys):
    """The plan's recomputed time is the GPU time its re-runs hold the compute stream, as the
    simulator counts it (it was the kernels' profiled time, host share included)."""
    plan = tmp_path / "plan.json"
    # batch 32: kernels whose shipped H100 profiles have device times below their times
    optimize("resnet50", plan, "1:3", "--recompute", "on", "--time-limit", "60", batch=32)
    said = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("recomputed")]
    assert main(["simulate", "--plan", str(plan)]) == 0
    again = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("recomputed")]
    assert said == again and ": 0 kernel re-runs" not in said[0], (said, again)
