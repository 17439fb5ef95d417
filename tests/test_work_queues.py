"""One hardware work queue for processes that replay plans as CUDA graphs (docs/gpu.md, "Copies
in a replay: the work queues"): set before the process first uses CUDA, by `autotm run --graph`
and each `autotm bench --arena` run, never over the environment's own choice, and a replay in a
process that runs with more says so. The speed-up itself is measured on the GPU
(experiments/gpu/connections_ab.sh); these tests run on the CPU."""

from __future__ import annotations

import pytest
import torch

from autotm_py import api
from autotm_py.cli import main
from autotm_py.errors import ConfigError
from autotm_py.runtime.device import (
    REPLAY_WORK_QUEUES,
    WORK_QUEUES_VARIABLE,
    replay_work_queues_note,
    use_replay_work_queues,
)
from tests.test_cli_newuser import mlp_onnx


@pytest.fixture
def fresh_process(monkeypatch):
    """A process whose environment sets no work queues and that has not used CUDA yet."""
    monkeypatch.delenv(WORK_QUEUES_VARIABLE, raising=False)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    return monkeypatch


def test_a_replaying_process_gets_one_work_queue_before_cuda_starts(fresh_process):
    import os

    assert replay_work_queues_note() is not None  # unset: CUDA's 8
    assert use_replay_work_queues() is None
    assert os.environ[WORK_QUEUES_VARIABLE] == REPLAY_WORK_QUEUES == "1"
    assert replay_work_queues_note() is None


def test_the_environments_choice_stands_and_a_replay_under_it_says_so(fresh_process):
    import os

    fresh_process.setenv(WORK_QUEUES_VARIABLE, "8")
    assert use_replay_work_queues() is None
    assert os.environ[WORK_QUEUES_VARIABLE] == "8"
    note = replay_work_queues_note()
    assert note.startswith(f"{WORK_QUEUES_VARIABLE} is 8 in this process: a replay's copies run")
    assert "autotm run --graph" in note


def test_too_late_once_cuda_is_in_use(fresh_process):
    import os

    fresh_process.setattr(torch.cuda, "is_initialized", lambda: True)
    note = use_replay_work_queues()
    assert WORK_QUEUES_VARIABLE not in os.environ  # the running context would not see it
    assert note is not None and "was unset (8 work queues) when CUDA started" in note


def test_only_replays_on_cuda_ask_for_it(fresh_process, tmp_path):
    import os

    from autotm_py.options import RunMode
    from autotm_py.plan import Plan

    plan = Plan.load(_mlp_and_plan(tmp_path)[1])
    assert api.prepare_cuda_process(plan, "cpu", RunMode(replay=True)) == []
    assert api.prepare_cuda_process(plan, "cuda", RunMode()) == []
    assert WORK_QUEUES_VARIABLE not in os.environ  # eager runs need several queues
    assert api.prepare_cuda_process(plan, "cuda:0", RunMode(replay=True)) == []
    assert os.environ[WORK_QUEUES_VARIABLE] == "1"


def _mlp_and_plan(tmp_path) -> tuple[str, str]:
    """A small ONNX model and an all-fast plan of it."""
    model = mlp_onnx(tmp_path / "mlp.onnx")
    plan = tmp_path / "plan.json"
    assert main(["optimize", model, "--ratio", "1:0", "--no-baselines", "-o", str(plan)]) == 0
    return model, str(plan)


def _queues_execute_sees(monkeypatch) -> list[str | None]:
    """`api.execute` replaced by a stub that notes the variable it finds, then stops the run."""
    import os

    seen: list[str | None] = []

    def execute(*args, **kwargs):
        seen.append(os.environ.get(WORK_QUEUES_VARIABLE))
        raise ConfigError("stopped by the test")

    monkeypatch.setattr(api, "execute", execute)
    return seen


def test_autotm_run_sets_it_before_anything_uses_cuda(fresh_process, tmp_path, capsys):
    """The CLI sets the variable before the model and its costs are loaded (a costs lookup
    may start CUDA): what `execute` sees."""
    model, plan = _mlp_and_plan(tmp_path)
    seen = _queues_execute_sees(fresh_process)
    eager = ["--no-arena", "--no-replay"]  # the plan's arena: the placed allocator, no GPU
    assert main(["run", model, "--plan", plan, "--device", "cuda", *eager]) == 2  # ConfigError
    assert main(["run", model, "--plan", plan, "--device", "cuda", "--no-arena", "--graph"]) == 2
    assert seen == [None, "1"]
    assert "stopped by the test" in capsys.readouterr().err


def test_a_bench_child_sets_it_for_its_replay(fresh_process, tmp_path):
    from autotm_py.bench import child

    model, plan = _mlp_and_plan(tmp_path)
    seen = _queues_execute_sees(fresh_process)
    for replay in (False, True):
        with pytest.raises(ConfigError):
            child.run_request({"model": model, "plan": plan, "device": "cuda",
                               "mode": {"replay": replay, "placed": False}})
    assert seen == [None, "1"]


def _replay_notes(tmp_path, env_value: str | None) -> dict:
    """`autotm run --graph --json` of a small plan in a fresh process (as a user runs it), with
    the work-queue variable unset or set to `env_value`."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    model, plan = _mlp_and_plan(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != WORK_QUEUES_VARIABLE}
    if env_value is not None:
        env[WORK_QUEUES_VARIABLE] = env_value
    root = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(root), env.get("PYTHONPATH"))))
    done = subprocess.run([sys.executable, "-m", "autotm_py", "run", model, "--plan", plan,
                           "--device", "cuda", "--graph", "--no-cap", "--iterations", "2",
                           "--json"], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


@pytest.mark.gpu
def test_a_replay_on_the_gpu_gets_one_queue_or_says_why(tmp_path):
    """On the device machine (`bash experiments/gpu/test_gpu.sh`): `autotm run --graph` in a
    fresh process replays with one queue (no note), and under the environment's 8 it says so."""
    ran = _replay_notes(tmp_path, None)
    assert ran["replayed"] and not any(WORK_QUEUES_VARIABLE in n for n in ran["notes"])
    ran = _replay_notes(tmp_path, "8")
    assert ran["replayed"]
    assert any(n.startswith(f"{WORK_QUEUES_VARIABLE} is 8") for n in ran["notes"])


def test_an_eager_run_in_a_process_set_up_for_replays_says_its_copies_overlap_less(
        fresh_process):
    """A capture that fails leaves the run eager, under the one queue set for the replay."""
    from autotm_py.runtime.device import eager_work_queues_note

    assert eager_work_queues_note() == ""
    fresh_process.setenv(WORK_QUEUES_VARIABLE, "1")
    assert eager_work_queues_note().startswith(f" with one work queue ({WORK_QUEUES_VARIABLE}=1")
