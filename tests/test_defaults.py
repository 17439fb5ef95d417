"""Best by default (issue 47 item 1): on a GPU `optimize`, `bench`, `train`, the Trainer and
`PlanConfig` plan as the benchmark's fastest plans were made (async, recompute, an arena with
placed outputs and scratch windows, CUDA-graph replay, channels-last where the profiles have
it), `autotm run` runs a plan the way it records, the portable forms are a flag away, and a
strategy name means one thing everywhere."""

from __future__ import annotations

import inspect
import json
import re

import pytest

from autotm_py import api, pipeline
from autotm_py.bench import BenchSpec, sweep_layout
from autotm_py.cli import _register_commands, cli, main
from autotm_py.config import DEFAULT_STRATEGY, PlanConfig, parse_strategy
from autotm_py.errors import ConfigError
from autotm_py.ir import is_channels_last
from autotm_py.options import GPU_RUN_MODE, HOST_RUN_MODE, ModelOptions, RunMode, default_run_mode
from autotm_py.plan import Plan

BEST = RunMode(arena=True, placed=True, scratch="auto", replay=True)


def _default(command: str, param: str):
    _register_commands()
    return next(p.default for p in cli.commands[command].params if p.name == param)


@pytest.fixture()
def mlp(tmp_path):
    from tests.test_cli_newuser import mlp_onnx

    return mlp_onnx(tmp_path / "mlp.onnx")


def test_optimize_bench_train_and_the_trainer_share_the_defaults():
    assert default_run_mode("cuda") == default_run_mode("cuda:1") == GPU_RUN_MODE == BEST
    assert default_run_mode("cpu") == HOST_RUN_MODE == RunMode()
    gpu, host = PlanConfig(), PlanConfig(device="cpu")
    assert (gpu.strategy, gpu.recompute_mode, gpu.run) == ("async", "on", BEST)
    assert (host.strategy, host.recompute_mode, host.run) == ("async", "off", RunMode())
    assert gpu.plan_name == "async+recompute" and host.plan_name == "async"
    # the commands' flags default to the same values
    for command in ("optimize", "bench"):
        assert _default(command, "device") == "cuda"
        assert _default(command, "recompute") == "auto"
        assert _default(command, "arena") is None and _default(command, "replay") is None
    assert _default("optimize", "strategy") == _default("bench", "strategies") == \
        DEFAULT_STRATEGY
    sweep = BenchSpec(models=("m",), ratios=("1:3",))
    assert (sweep.device, sweep.plan_names, sweep.run) == ("cuda", ("async+recompute",), BEST)
    assert BenchSpec(models=("m",), ratios=("1:3",), device="cpu").plan_names == ("async",)
    # the Trainer plans the same family in the same run mode (autotm_py/trainer/core.py)
    from autotm_py.trainer import Trainer
    from autotm_py.trainer.loop import default_mode

    given = inspect.signature(Trainer.__init__).parameters
    trainer = PlanConfig(strategy=given["strategy"].default, recompute=given["recompute"].default)
    assert trainer.plan_name == gpu.plan_name
    assert default_mode("cuda") == BEST  # and `autotm train`'s (trainer/files.py)
    assert not default_mode("cpu").arena and not default_mode("cpu").replay


def test_a_plan_made_with_no_flags_on_a_gpu_records_the_best_run_mode_and_runs_so(
        net, tmp_path, capsys):
    path = tmp_path / "plan.json"
    assert main(["optimize", "net", "--fast-mem", "900KiB", "--no-baselines", "-o",
                 str(path)]) == 0
    out = capsys.readouterr().out
    assert "plan async+recompute (strategy async, recompute on)" in out
    assert "run        arena at planned addresses, placed outputs, scratch windows, CUDA-graph " \
        "replay (how `autotm run` runs it)" in out
    plan = Plan.load(path)
    assert plan.header.strategy == "async+recompute" and plan.arena is not None
    assert plan.header.run == RunMode(arena=True, placed=True, scratch="windows", replay=True)
    # `autotm run` runs it so, as far as the device can: on the CPU in its arena, not replayed
    assert plan.header.run.on("cuda") == plan.header.run
    assert plan.header.run.on("cpu") == RunMode(True, True, "windows", replay=False)


def test_the_portable_plan_is_a_flag_away(net, tmp_path, capsys):
    path = tmp_path / "plan.json"
    assert main(["optimize", "net", "--fast-mem", "900KiB", "--no-baselines", "--strategy",
                 "sync", "--no-arena", "--no-replay", "--recompute", "off", "-o",
                 str(path)]) == 0
    out = capsys.readouterr().out
    assert "run        eager, on torch's caching allocator" in out
    plan = Plan.load(path)
    assert plan.header.strategy == "sync" and plan.arena is None
    assert plan.header.run == RunMode(arena=False, placed=True, scratch="region", replay=False)
    # host mode: no arena, no replay, no run line; asking for them there is a one-line error
    assert main(["optimize", "net", "--fast-mem", "900KiB", "--no-baselines", "--device", "cpu",
                 "-o", str(path)]) == 0
    assert "run        " not in capsys.readouterr().out
    assert Plan.load(path).header.run == RunMode(scratch="region")
    for flag in ("--arena", "--replay"):
        assert main(["optimize", "net", "--fast-mem", "900KiB", "--device", "cpu", flag]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {flag} is for the GPU mode") and err.count("\n") == 1
        assert "add --device cuda" in err


def test_run_runs_the_plan_the_way_it_records(mlp, tmp_path, capsys):
    path = tmp_path / "plan.json"
    assert main(["optimize", mlp, "--batch", "8", "--training", "--ratio", "1:0",
                 "--no-baselines", "-o", str(path)]) == 0
    assert Plan.load(path).header.run.arena
    capsys.readouterr()
    run = ["run", "--plan", str(path), "--device", "cpu", "--iterations", "1", "--warmup", "0",
           "--json"]
    assert main(run) == 0
    done = json.loads(capsys.readouterr().out)
    assert done["mode"]["arena"] and not done["mode"]["replay"] and not done["replayed"]
    assert main([*run, "--no-arena"]) == 0
    assert not json.loads(capsys.readouterr().out)["mode"]["arena"]
    assert main([*run, "--replay"]) == 2  # asked for on the CPU: the one-line error
    err = capsys.readouterr().err
    assert err.startswith("error: --replay captures and replays a CUDA graph") and \
        err.count("\n") == 1


@pytest.mark.parametrize(("name", "recompute", "device", "plan"), [
    ("async", "auto", "cuda", "async+recompute"), ("async", "auto", "cpu", "async"),
    ("async", "off", "cuda", "async"), ("async", "on", "cpu", "async+recompute"),
    ("sync", "auto", "cuda", "sync+recompute"), ("static", "auto", "cuda", "static"),
    ("async+recompute", "auto", "cpu", "async+recompute"),
    ("async+recompute", "on", "cuda", "async+recompute"),
    ("sync+recompute", "auto", "cuda", "sync+recompute"),
    ("recompute-only", "auto", "cuda", "recompute-only"),
    ("async", "only", "cuda", "recompute-only"),
])
def test_a_strategy_name_means_one_thing_everywhere(name, recompute, device, plan):
    config = PlanConfig(strategy=name, recompute=recompute, device=device)
    assert config.plan_name == plan
    assert config.strategy in ("static", "sync", "async")
    sweep = BenchSpec(models=("m",), ratios=("1:3",), strategies=(name,), recompute=recompute,
                      device=device)
    assert sweep.plan_names == (plan,)
    # a plan's name read back names its family, whatever the device
    assert PlanConfig.for_plan_name(plan, device=device).plan_name == plan


def test_plan_names_fix_the_recompute_mode_and_a_sweep_lists_each_plan_once(net, capsys):
    assert parse_strategy("async") == ("async", "auto")
    assert parse_strategy("async+recompute") == ("async", "on")
    assert parse_strategy("recompute-only", "only") == ("sync", "only")
    for name, other in (("async+recompute", "off"), ("recompute-only", "on")):
        with pytest.raises(ConfigError, match=re.escape(f"--strategy {name} means --recompute")):
            PlanConfig(strategy=name, recompute=other)
    with pytest.raises(ConfigError, match="choose one of static, sync, async, sync"):
        PlanConfig(strategy="fast")
    assert PlanConfig.for_plan_name("async", device="cuda").recompute_mode == "off"  # move-only
    both = dict(models=("m",), ratios=("1:3",), strategies=("async", "async+recompute"))
    assert BenchSpec(**both).plan_names == ("async+recompute",)
    assert BenchSpec(**both, recompute="off").plan_names == ("async", "async+recompute")
    assert main(["optimize", "net", "--fast-mem", "900KiB", "--strategy", "async+recompute",
                 "--recompute", "off"]) == 2
    err = capsys.readouterr().err
    assert err == ("error: --strategy async+recompute means --recompute on: drop --recompute "
                   "off, or give --strategy async --recompute off\n")


def test_gpu_mode_stores_a_cnn_channels_last_where_the_profiles_have_it(tmp_path):
    graph = api.load_model("resnet50", batch=32, training=True)
    # no GPU here: the shipped H100 profiles price it, and they have no channels-last kernels
    here = api.load_costs(graph, device="cuda", profiles_dir=tmp_path)
    same, _ = api.default_layout(graph, here, profiles_dir=tmp_path)
    assert same is graph
    h200 = api.load_costs(graph, device="cuda", profiles_dir=tmp_path, gpu="h200")
    last, costs = api.default_layout(graph, h200, profiles_dir=tmp_path, gpu="h200")
    assert is_channels_last(last) and costs.n_estimated == 0 and costs.n_borrowed == 0
    host = api.load_costs(graph, device="cpu", profiles_dir=tmp_path)
    assert api.default_layout(graph, host, profiles_dir=tmp_path)[0] is graph
    # a sweep: channels-last when every CNN of it would be; other models and bad names aside
    options = ModelOptions(batch=32, training=True)
    for models, gpu, device, want in ((("resnet50", "nosuch"), "h200", "cuda", True),
                                      (("resnet50",), None, "cuda", False),
                                      (("resnet50",), "h200", "cpu", False),
                                      (("transformer",), "h200", "cuda", False)):
        got = sweep_layout(models, options, device=device, gpu=gpu, profiles_dir=str(tmp_path))
        assert got.channels_last is want, (models, gpu, device)


def test_optimize_says_which_layout_it_took(tmp_path, capsys):
    args = ["optimize", "resnet50", "--training", "--batch", "32", "--gpu", "h200",
            "--precision", "fp32", "--strategy", "static", "--fast-mem", "40GiB",
            "--no-baselines", "--profiles",
            str(tmp_path / "cache"), "-o", str(tmp_path / "plan.json")]
    assert main(args) == 0
    assert "layout     convolution images stored N, H, W, C, as the profiles have them " \
        "(--no-channels-last for N, C, H, W)" in capsys.readouterr().out
    assert Plan.load(tmp_path / "plan.json").header.model.channels_last
    assert main([*args, "--no-channels-last"]) == 0
    assert "layout     convolution images stored N, C, H, W (--no-channels-last)" in \
        capsys.readouterr().out
    assert not Plan.load(tmp_path / "plan.json").header.model.channels_last


def test_the_fit_loops_solves_share_one_time_limit(monkeypatch):
    """An arena plan whose packing does not fit is solved again (`fitting.fit_arena`): the
    re-solve gets what is left of --time-limit, at least a quarter of it, not the whole again
    (the first packing leaves holes: `first_packing_leaves_holes`)."""
    import time
    from dataclasses import replace

    from autotm_py.ir.training import derive_training
    from autotm_py.planning import SolveControl, solve
    from tests.graphs import costs_for, first_packing_leaves_holes
    from tests.test_training_models import tiny_decoder

    assert PlanConfig(time_limit_s=300).time_left(100).time_limit_s == 200
    assert PlanConfig(time_limit_s=300).time_left(290).time_limit_s == 75
    assert PlanConfig(time_limit_s=None).time_left(290).time_limit_s is None
    graph = derive_training(tiny_decoder(), optimizer="adam")
    costs = costs_for(graph)
    base = (graph.max_working_set[0] + graph.peak_live_bytes) // 2
    probe = pipeline.machine_for(graph, PlanConfig(fast_mem_bytes=base), costs)
    config = PlanConfig(fast_mem_bytes=base + probe.scratch_reserve, strategy="sync",
                        recompute="off", time_limit_s=40.0)
    limits: list[float | None] = []
    real = solve.plan

    def noted(machine, config, control=None, **kw):
        limits.append(config.time_limit_s)
        return real(machine, config, control, **kw)

    monkeypatch.setattr(solve, "plan", noted)
    first_packing_leaves_holes(monkeypatch)
    control = SolveControl(time_limit_s=40.0)
    control._progress = replace(control.progress, started=time.monotonic() - 38.0)
    result = pipeline.optimize(graph, config, costs=costs, control=control)
    assert any("solved again" in n for n in result.plan.header.notes)
    assert limits[0] == 40.0 and len(limits) >= 2
    assert all(limit == 10.0 for limit in limits[1:]), limits  # a quarter: 2 s were left
