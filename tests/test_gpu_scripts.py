"""The GPU machine's measurement scripts, smoke-tested on the CPU (their `--device cpu` mode):
a script bug found here costs no device time. Times on the CPU mean nothing; what is checked is
that the script runs a plan the way the GPU run would and writes the results it promises."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from autotm_py import api
from autotm_py.config import PlanConfig
from autotm_py.options import RunMode
from autotm_py.pipeline import optimize
from autotm_py.plan import Plan
from autotm_py.units import parse_ratio

ROOT = Path(__file__).resolve().parents[1]
# One benchmark plan kept as a fixture (experiments/plans/ is not tracked: docs/developer.md,
# "Keeping the repository lean"): ResNet-50 b32's joint plan at 33%, priced for the H200, which
# the committed run experiments/results/bench_arena/2026-11-28g/calld/r/resnet50_..._1-3_...
# measured (copied from experiments/plans/bench_arena at de42c94).
PLANS = ROOT / "tests" / "fixtures" / "plans"
RESNET50_PLAN = PLANS / ("resnet50_32_True_cuda_h100-pcie5_1-3_async+recompute_highs_arena+"
                         "graph+placed+windows+gpu-h200.json.gz")


def test_recompute_check_runs_joint_plans_and_merges_their_rows(tmp_path):
    graph = api.load_model("transformer", batch=1, dims={"seq": 8}, training=True)
    config = PlanConfig(device="cuda", ratio=parse_ratio("1:1"), strategy="async",
                        recompute="on", run=RunMode(arena=True, replay=True), time_limit_s=10)
    plan = optimize(graph, config).plan
    assert plan is not None and plan.arena is not None
    plans = tmp_path / "plans"
    plan.save(plans / "transformer_1-1_smoke.json.gz")
    out = tmp_path / "out"
    env = os.environ | {"PLANS": str(plans), "MATCH": "*smoke", "ITERATIONS": "1",
                        "BUDGET_S": "300", "EXTRA": "--device cpu --no-ours"}
    done = subprocess.run(["bash", "experiments/gpu/recompute_check.sh", str(out),
                           "transformer,bert_base"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "bert_base: no plans" in done.stdout  # a model without plans is skipped, not an error
    doc = json.loads((out / "recompute_check.json").read_text())  # merged from out/transformer/
    (row,) = doc["rows"]
    assert row["model"] == "transformer" and row["all_fast"]["median_s"] > 0
    (cell,) = row["budgets"].values()
    result = cell["async+recompute"]["result"]
    assert result["file"] == "transformer_1-1_smoke.json.gz"
    assert result["median_s"] > 0 and result["arena"] and result["strategy"] == "async+recompute"
    assert "transformer" in (out / "recompute_check.txt").read_text()


def _script(name: str):
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, ROOT / "experiments" / "gpu" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_numa_probe_reads_nodes_and_their_cpus(tmp_path):
    probe = _script("numa_probe")
    assert probe.parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    for node, cpus in ((0, "0-1"), (1, "2-3"), (2, "")):  # node 2: memory only
        (tmp_path / f"node{node}").mkdir()
        (tmp_path / f"node{node}" / "cpulist").write_text(cpus + "\n")
    assert probe.numa_nodes(tmp_path) == {0: [0, 1], 1: [2, 3], 2: []}
    out = subprocess.run([sys.executable, "experiments/gpu/numa_probe.py"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "NUMA node" in out.stdout


def test_bn_rerun_probe_times_each_batch_norm_shape_once(tmp_path):
    """experiments/gpu/bn_rerun_probe.py on the CPU (a smoke test, not a measurement): one row
    per distinct batch norm of the graph, with its count, each re-run checked bit for bit
    against its first run's Y; the summary weighs the rows by their counts."""
    out = tmp_path / "bn.json"
    done = subprocess.run([sys.executable, "experiments/gpu/bn_rerun_probe.py", str(out),
                           "--model", "resnet50", "--batch", "1", "--device", "cpu",
                           "--iterations", "2"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    rows, total = result["rows"], result["summary"]
    assert total["batch_norms"] == 53 == sum(r["count"] for r in rows)
    assert len(rows) < 53 and all(r["dtype"] == "bfloat16" and r["channels_last"] for r in rows)
    assert total["again_ms"] == pytest.approx(sum(r["again_ms"] * r["count"] for r in rows))
    assert total["share"] == pytest.approx(total["again_ms"] / total["first_ms"])


def _bench_doc(times: dict[str, float]) -> dict:
    row = {"model": "m", "batch": 1, "dims": "", "training": True, "device": "cuda",
           "memory": "h100", "ratio": "1:1", "strategy": "sync", "solver": "highs"}
    return {"rows": [row | {f"measured_{k}_s": v for k, v in times.items()}]}


def test_pass_spread_sets_the_two_gpu_effect_beside_the_noise(tmp_path):
    passes = {"one_1": {"": 1.00, "lru": 1.0}, "one_2": {"": 1.01, "lru": 1.3},
              "two_1": {"": 1.20, "lru": 1.1}, "two_2": {"": 1.21, "lru": 1.2}}
    for name, times in passes.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(_bench_doc(times)))
    out = subprocess.run([sys.executable, "experiments/gpu/pass_spread.py", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = {line.split()[2]: line for line in out.stdout.splitlines()[1:-1]}
    assert lines["plan"].endswith("outside")  # 20% slower on two GPUs, the one-GPU spread is 1%
    assert not lines["lru"].endswith("outside")  # within the one-GPU passes' 1.0-1.3
    assert "Outside the one-GPU range by over 2%: 1 (1:1 sync plan)" in out.stdout


def test_oom_summary_sums_pools_stranded_free_bytes_and_who_allocated():
    summary = _script("capture_memory")
    frame = {"filename": "/x/autotm_py/kernels/attention.py", "line": 12, "name": "sdpa_bwd"}
    torch_frame = {"filename": "/site/torch/functional.py", "line": 3, "name": "f"}
    snapshot = {"segments": [
        {"total_size": 100, "allocated_size": 60, "segment_pool_id": (0, 0), "stream": 0,
         "blocks": [{"size": 60, "requested_size": 50, "state": "active_allocated",
                     "frames": [torch_frame, frame]},
                    {"size": 40, "state": "inactive"}]},
        {"total_size": 30, "allocated_size": 20, "segment_pool_id": (1, 2), "stream": 7,
         "blocks": [{"size": 20, "state": "active_allocated"},
                    {"size": 10, "state": "inactive"}]}]}
    out = summary.summarize(snapshot, requested=64)
    assert (out["reserved"], out["allocated"], out["requested"]) == (130, 80, 64)
    assert out["pools"]["default"] == {"reserved": 100, "allocated": 60, "segments": 1,
                                       "largest_segment": 100}
    assert out["pools"]["private 1,2"]["segments"] == 1
    assert out["free_in_segments"] == {"bytes": 50, "largest": 40, "blocks": 2}
    assert out["largest_live"][0]["where"] == "kernels/attention.py:12 sdpa_bwd"
    assert out["largest_live"][0]["requested"] == 50
    assert out["live_by_where"] == {"kernels/attention.py:12 sdpa_bwd": 60, "unknown": 20}


def test_replay_profile_sums_streams_idle_time_and_copies():
    profile = _script("replay_profile")
    assert profile.union([(0, 10), (5, 15), (20, 25)]) == 20
    events = [{"name": "gemm", "start": 0, "dur": 10_000, "stream": 7},
              {"name": "gemm", "start": 20_000, "dur": 10_000, "stream": 7},
              {"name": "Memcpy HtoD (Pinned -> Device)", "start": 5_000, "dur": 20_000,
               "stream": 9}]
    out = profile.summarize(events)
    assert out["compute_stream"] == 7 and out["span_ms"] == 0.03
    assert out["compute_idle_ms"] == 0.01 and out["busy_ms"]["9"] == 0.02
    assert out["by_kind"]["h2d"]["count"] == 1 and out["by_kind"]["kernel"]["total_ms"] == 0.02
    assert out["copies_ms"] == {"h2d": 0.02, "d2h": 0.0, "both_directions": 0.0,
                                "any_direction": 0.02, "copies_beside_kernels": 0.01}
    slower = {"by_name_ms": {"gemm": 0.03, "Memcpy HtoD (Pinned -> Device)": 0.02}}
    assert profile.differences(out, slower, 1) == [
        {"name": "gemm", "eager_ms": 0.02, "replay_ms": 0.03}]


def test_replay_profile_matches_each_copy_of_a_plan_between_eager_and_replay():
    """`--copies`: the k-th copy of a direction in time order is the plan's k-th move that
    way, with its bytes and offsets; groups give the median replay/eager ratio."""
    import sys

    sys.path.insert(0, str(Path("experiments/gpu").resolve()))
    from recompute_check import graph_of

    from autotm_py.plan import Move, Plan

    profile = _script("replay_profile")
    plan = Plan.load(RESNET50_PLAN)
    graph = graph_of(plan)
    moves = profile.plan_moves(plan, graph)
    to_fast = [r.to == "fast" for r in plan.records if isinstance(r, Move)]
    assert (len(moves["h2d"]), len(moves["d2h"])) == (sum(to_fast), len(to_fast) - sum(to_fast))
    assert all(m["device_mod_4096"] % 512 == 0 for d in moves for m in moves[d])

    def events(direction, scale, stream):
        name = "Memcpy HtoD (Pinned -> Device)" if direction == "h2d" else "Memcpy DtoH"
        return [{"name": name, "start": i, "dur": int(m["bytes"] / 55 * scale),
                 "stream": stream + i % 2} for i, m in enumerate(moves[direction])]

    eager = events("h2d", 1.0, 7) + events("d2h", 1.0, 9)
    replay = events("h2d", 1.1, 100) + events("d2h", 1.0, 200)
    out = profile.per_copy(plan, graph, eager, replay)
    assert out["h2d"]["by"]["stream"]["100"][1] == pytest.approx(1.1, abs=1e-3)
    assert out["d2h"]["by"]["mode"]["async"][1] == pytest.approx(1.0, abs=1e-3)
    assert out["d2h"]["by"]["mode"]["async"][2] == pytest.approx(55.0, rel=1e-3)  # GB/s
    n = len(moves["h2d"])
    assert profile.per_copy(plan, graph, eager[:10], replay)["h2d"] == {"unmatched": [10, n, n]}
    assert [profile.size_bucket(n) for n in (1, 2**20, 5 << 20, 16 << 20)] == [
        "<1 MiB", "<4 MiB", "<16 MiB", "<64 MiB"]


def test_summarize_reads_the_committed_arena_benchmark():
    """The tables of docs/results.md (H100) and of experiments/journal/gpu-2026-11.md
    "The benchmark at planned addresses" come from this file."""
    summarize = _script("summarize")
    path = ROOT / "experiments" / "results" / "bench_arena" / "bench_arena_h100.json"
    rows = [r for r in json.loads(path.read_text())["rows"] if r.get("measured_s")]
    table = summarize.table(rows)
    assert "| resnet200 b32 | 25% | async+recompute [arena+graph+placed+spread] |" in table
    text = summarize.targets(rows)
    assert "joint plans at 50% vs all-fast: geometric mean 1.12x over 5 models" in text
    assert "joint plans at 25% vs all-fast: geometric mean 1.33x over 3 models" in text
    assert "resnet200 25%: 4.08x faster than async" in text
    assert "measured peak above the budget: 0 of" in text
    assert "reserved peak above the budget: 0 of" in text


def test_replay_busy_reads_the_names_bench_gives_its_plans():
    """experiments/gpu/replay_busy.py takes the cell of a plan from its file name (the names
    `autotm bench --plans` writes): the committed fixture plan and the names today's sweeps
    give (dims, chunked loss, channels-last, spread reads, another GPU's pricing) parse to the
    batch, dims, ratio and strategy they were solved for, and `--all-fast MODEL/BATCH/DIM=V`
    gives the same cells."""
    sys.path.insert(0, str(ROOT / "experiments" / "gpu"))
    import replay_busy

    from autotm_py.bench.spec import BenchSpec
    from autotm_py.options import ModelOptions

    cell = replay_busy.cell_of(RESNET50_PLAN)
    header = json.loads(gzip.decompress(RESNET50_PLAN.read_bytes()))["header"]
    assert cell["ratio"] == header["config"]["ratio"] == "1:3"
    assert (cell["model"], cell["batch"], cell["dims"], cell["strategy"], cell["training"]) == (
        "resnet50", 32, {}, "async+recompute", True)
    run = RunMode(arena=True, replay=True)
    sweeps = [
        (BenchSpec(models=("bert_base",), ratios=("1:2",), strategies=("async+recompute",),
                   device="cuda", memory="h100-pcie5", run=run, plans_dir="p",
                   model=ModelOptions(batch=16, dims={"seq": 512}, training=True,
                                      loss_chunks=16)), {"seq": 512}),
        (BenchSpec(models=("vgg19",), ratios=("9:1",), strategies=("async",), device="cuda",
                   memory="h200-pcie5", run=run, plans_dir="p", gpu="h200",
                   model=ModelOptions(batch=64, training=True, channels_last=True)), {}),
        (BenchSpec(models=("gpt2_small",), ratios=("1:1",), strategies=("recompute-only",),
                   device="cuda", memory="h100-pcie5", run=run, plans_dir="p",
                   read_pricing="spread",
                   model=ModelOptions(batch=8, dims={"seq": 1024}, training=True)),
         {"seq": 1024}),
    ]
    for spec, dims in sweeps:
        ((model, ratio, strategy, solver),) = spec.cells()
        path = spec.plan_path(model, ratio, strategy, solver)
        cell = replay_busy.cell_of(path)
        assert (cell["model"], cell["batch"], cell["dims"], cell["ratio"], cell["strategy"]) == (
            model, spec.model.batch, dims, ratio, strategy), path.name
        assert cell["options"] == spec.options and cell["training"]
    bert = replay_busy.cell_of(sweeps[0][0].plan_path("bert_base", "1:2", "async+recompute",
                                                      "highs"))
    assert replay_busy.all_fast_cell("bert_base/16/seq=512")["dims"] == bert["dims"]


def test_native_checkpointing_runs_with_relus_made_out_of_place():
    """native_compare.py checkpoints torchvision VGG19 with `checkpoint_sequential`, whose
    `ReLU(inplace=True)` after a segment boundary overwrote a tensor saved for backward (the
    H100 run of 2026-11-28 stopped there); with `out_of_place_relus` the same segments run and
    give eager's gradients."""
    import torch
    from torch.utils.checkpoint import checkpoint_sequential

    native = _script("native_compare")

    def net():
        torch.manual_seed(0)
        layers = []
        for _ in range(3):
            layers += [torch.nn.Linear(8, 8), torch.nn.ReLU(inplace=True)]
        return torch.nn.Sequential(*layers, torch.nn.Linear(8, 2))

    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    eager = net()
    eager(x).sum().backward()
    broken = net()
    with pytest.raises(RuntimeError, match="inplace operation"):
        checkpoint_sequential(broken, 4, x, use_reentrant=False).sum().backward()
    fixed = net()
    native.out_of_place_relus(fixed)
    checkpoint_sequential(fixed, 4, x, use_reentrant=False).sum().backward()
    for a, b in zip(eager.parameters(), fixed.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)


def test_prediction_errors_reads_runs_and_bench_rows(capsys, monkeypatch):
    """experiments/journal/gpu-2026-11.md "Plans priced for the H200": the H200-priced plans' median
    error comes from these committed run files and bench rows."""
    errors = _script("prediction_errors")
    base = ROOT / "experiments" / "results" / "bench_arena" / "2026-11-28g"
    arena = [base / "calld", base / "callb", base / "callc", *sorted(base.glob("f[id]/*h200.json"))]
    monkeypatch.setattr(sys, "argv", ["prediction_errors.py", *map(str, arena)])
    errors.main()
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("median |predicted - measured| / measured: 1.0% over 32 runs")
    assert last.endswith("allocator retries: 0; reserved peak above the budget: 0 of 32")
    fit_rows = errors.runs_under(base / "fi", bench_rows=True)
    assert sum(r[3] for r in fit_rows) == 15 and len(fit_rows) == 6  # 4 rows and 2 arena runs


def test_repredict_link_prices_the_same_plans_on_the_h200s_link(monkeypatch):
    """experiments/journal/gpu-2026-11.md "The H200's own link": a committed H200 run's plan,
    predicted on the link it records (the prediction it ran with, replayed copies priced with the
    factors of then, `--replay-factors 1.04,1.13`) and on the H200's calibrated one (less: its
    copies beside kernels are faster)."""
    monkeypatch.setattr("autotm_py.machine.REPLAY_TO_FAST_SLOWDOWN", 1.04)
    monkeypatch.setattr("autotm_py.machine.REPLAY_TO_SLOW_SLOWDOWN", 1.13)
    # and its SGD updates priced as then, by their profiles (not yet folded: 2026-12-04)
    monkeypatch.setattr("autotm_py.machine.MachineModel._folded_updates", lambda self: None)
    link = _script("repredict_link")
    run = (ROOT / "experiments" / "results" / "bench_arena" / "2026-11-28g" / "calld" / "r" /
           "resnet50_32_True_cuda_h100-pcie5_1-3_async_recompute_highs_arena_graph_placed_"
           "windows_gpu-h200.json")
    [(stem, measured)] = link.runs_under(run)
    plan = link.plan_index(PLANS)[stem]
    recorded, h200 = link.predictions(plan, "h200-pcie5")
    assert recorded == pytest.approx(json.loads(run.read_text())["predicted_time_s"], rel=1e-3)
    assert measured < h200 < 0.99 * recorded  # measured 44.0 ms, predicted 45.3 -> 44.5


def _stand_in_python(tmp_path, line: str) -> dict[str, str]:
    """The environment of a script whose `python3` is a shell stand-in running `line`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python3"
    fake.write_text(f"#!/bin/sh\n{line}\n")
    fake.chmod(0o755)
    return os.environ | {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_plan_by_plan_scripts_run_each_spec_under_each_setting(tmp_path):
    """eager_vs_replay.sh and connections_ab.sh share run_spec.sh: one `autotm run` process per
    spec and setting, its output kept, one line printed. A stand-in python3 records how it was
    called (the real runs need the GPU)."""
    env = _stand_in_python(tmp_path, 'echo "measured $CUDA_DEVICE_MAX_CONNECTIONS $*"')
    spec = "vgg19:64:plans/vgg19_1-1+gpu.json.gz:seq=8"

    def run(*args: str) -> list[str]:
        done = subprocess.run(["bash", *args], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()

    lines = run("experiments/gpu/eager_vs_replay.sh", str(tmp_path / "e"), spec)
    assert [line.split(" rc=")[0] for line in lines] == ["eager vgg19_1-1_gpu",
                                                         "graph vgg19_1-1_gpu"]
    graph = (tmp_path / "e" / "vgg19_1-1_gpu_graph.txt").read_text()
    assert "--batch 64 --dim seq=8 --plan plans/vgg19_1-1+gpu.json.gz" in graph
    assert "--arena --graph -o" in graph and "--graph" not in \
        (tmp_path / "e" / "vgg19_1-1_gpu_eager.txt").read_text()
    lines = run("experiments/gpu/connections_ab.sh", str(tmp_path / "c"), "1 8", spec)
    assert [line.split(" rc=")[0] for line in lines] == [
        "connections=1 vgg19_1-1_gpu round 1", "connections=8 vgg19_1-1_gpu round 1"]
    assert lines[1].split(" rc=")[1].startswith("0 measured 8 -m autotm_py run vgg19")
    assert (tmp_path / "c" / "vgg19_1-1_gpu_c8_r1.txt").exists()


def test_transformer_compare_runs_small_and_ranks_kernels_ours_is_slower_on(tmp_path):
    """experiments/gpu/transformer_compare.py --small (the CPU, tiny shapes) on the in-code
    GPT-2 (transformers is not a dependency): native, ours through the Trainer and autograd of
    the imported graph from the same weights, the fused forward's op counts checked; and the
    table of kernels where ours spends more than native."""
    compare = _script("transformer_compare")
    native = {"kernels": [{"name": "gemm_a", "ms": 2.0, "per_step": 4},
                          {"name": "fmha_cutlassF", "ms": 1.0, "per_step": 2}]}
    ours = {"kernels": [{"name": "gemm_a", "ms": 2.5, "per_step": 4},
                        {"name": "fmha_cutlassF", "ms": 0.5, "per_step": 2},
                        {"name": "vectorized_elementwise_kernel", "ms": 0.2, "per_step": 9}]}
    rows = compare.slower(native, ours, 15)
    assert [(r["name"], r["kind"]) for r in rows] == [("gemm_a", "gemm"),
                                                      ("vectorized_elementwise_kernel",
                                                       "elementwise")]
    assert rows[0]["diff_ms"] == pytest.approx(0.5)
    assert compare.fusion_check("llama", {"ScaledDotProductAttention": 2, "Softmax": 1,
                                          "RMSNormalization": 5, "Silu": 2,
                                          "RotaryEmbedding": 4}, 2) == \
        ["Softmax left unfused (1)"]
    assert compare.fusion_check("llama", {"ScaledDotProductAttention": 2, "RMSNormalization": 5,
                                          "Silu": 2, "RotaryEmbedding": 3, "Neg": 1,
                                          "Concat": 1}, 2) == \
        ["RotaryEmbedding: 3, expected 4", "Neg left unfused (1)", "Concat left unfused (1)"]
    out = subprocess.run([sys.executable, "experiments/gpu/transformer_compare.py",
                          str(tmp_path), "--small", "--models", "gpt2", "--iterations", "2"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    (row,) = json.loads((tmp_path / "transformer_compare.json").read_text())
    assert row["fusion_problems"] == [] and row["forward_ops"]["ScaledDotProductAttention"] == 2
    assert row["ours_first_loss"] == pytest.approx(row["native_first_loss"], rel=1e-4)
    assert all(row[k]["median_s"] > 0 and row[k]["loop_s"] > 0
               for k in ("native", "ours", "autograd"))
    assert row["loop_ours_over_autograd"] > 0 and "back to back: ours" in out.stdout
    assert "gpt2 fusion: as intended" in out.stdout


def test_bf16_bench_processes_coordinate_and_summarize(tmp_path):
    """experiments/gpu/bf16_bench.sh's pieces on the CPU (issue 46 item 5): trainer_bench.py in
    bf16 writes the budgets once its graph exists and touches its signal once its Trainer does,
    runs the Trainer's bf16 plan under the lock, and bf16_summary.py turns its result and a
    native process's into rows and the issue's targets."""
    out = tmp_path / "tiny"
    out.mkdir()
    done = subprocess.run(
        [sys.executable, "experiments/gpu/trainer_bench.py", str(out / "ours_1.json"),
         "--model", "tiny", "--batch", "256", "--steps", "5", "--device", "cpu", "--shares", "1",
         "--precision", "bf16", "--time-limit", "10", "--no-eager", "--lock",
         str(out / "gpu.lock"), "--budgets-out", str(out / "budgets.json"), "--budget-shares",
         "0.9,0.95", "--signal", str(out / "profiled"), "--profile-chunks", "2",
         "--save-plans", "--plan-option", "write_pricing=spread", "--plan-option",
         "async_window=30"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (out / "profiled").exists()
    # the capped processes' graph (its loss in 2 chunks: more kernels) priced before its own
    priced = re.findall(r"(\d+) kernels of Sequential/train have no profile",
                        done.stdout + done.stderr)
    assert len(set(priced)) == 2, priced
    saved = Plan.load(out / "ours_1.json.1.0.plan.json")
    assert saved.header.budget_bytes is None or saved.header.budget_bytes > 0
    assert (saved.header.config["write_pricing"], saved.header.config["async_window"]) == \
        ("spread", 30)  # --plan-option reaches the Trainer's plan
    budgets = json.loads((out / "budgets.json").read_text())
    assert 0 < budgets["budgets"]["0.9"] < budgets["budgets"]["0.95"] < budgets["peak_bytes"]
    ours = json.loads((out / "ours_1.json").read_text())
    (row,) = ours["rows"]
    assert ours["eager"] is None and row["ours"]["precision"] == "bf16"
    assert len(row["ours"]["losses"]) == 5 and row["ours"]["step_s"] > 0
    assert len(row["ours"]["step_times_s"]) == 5  # each step's, beside the median
    losses = row["ours"]["losses"]
    native = {"model": "tiny", "eager": {"losses": losses, "step_s": 2 * row["ours"]["step_s"]},
              "native": {"checkpoint": {"0.9": {"median_s": 1.0, "cap": 10}},
                         "compile": {"0.1": {"0.9": {"median_s": None, "out_of_memory": True}}}}}
    (out / "native.json").write_text(json.dumps(native))
    summary = _script("bf16_summary")
    rows = summary.rows_of(out)
    assert [r["option"] for r in rows] == ["autocast eager", "ours", "autocast + checkpointing",
                                           "autocast + torch.compile amb 0.1"]
    assert rows[1]["loss_max_rel_diff_vs_eager"] == 0.0
    assert summary.targets(rows)[0].endswith("(met: no slower)")
    assert summary.main([str(out)]) == 0 and (out / "rows.json").exists()
    # a 25% plan whose search a time limit ended says how far from its bound
    quarter = {"option": "ours", "share": 0.25, "step_s": 2.0, "status": "time_limit",
               "gap": 0.235}
    fast = {"option": "ours", "share": 1.0, "step_s": 1.0}
    assert summary.targets([fast, quarter])[0] == (
        "25%: 2.000x our all fast (missed: within 1.25x); its solve stopped at the time limit "
        "23.5% from its bound")
    solved = summary.targets([fast, quarter | {"status": "optimal"}])[0]
    assert solved == "25%: 2.000x our all fast (missed: within 1.25x)"
    # ALT's runs (ours_<share>_alt.json) are rows of their own, with targets of their own
    (out / "ours_0.9_alt.json").write_text((out / "ours_1.json").read_text())
    assert [r["option"] for r in summary.rows_of(out)].count(summary.ALT) == 1
    alt = {"option": summary.ALT, "share": 0.25, "step_s": 1.2}
    lines = summary.targets([fast, quarter, alt])
    assert "ours, ALT options: 25%: 1.200x our all fast (met: within 1.25x)" in lines
    assert lines[0].startswith("25%: 2.000x")


def test_bf16_bench_budgets_share_the_plain_loss_whatever_loss_the_process_trains(tmp_path):
    """bf16_bench.sh's all fast trains with the Trainer's default loss (in blocks on a GPU) but
    writes budgets that are shares of the plain loss's graph, the model as users run it: the
    peak in budgets.json is that graph's, not the chunked graph the process planned."""
    out = tmp_path / "gpt2"
    out.mkdir()
    done = subprocess.run(
        [sys.executable, "experiments/gpu/trainer_bench.py", str(out / "ours_1.json"),
         "--model", "gpt2", "--small", "--batch", "2", "--seq", "32", "--steps", "4", "--device",
         "cpu", "--shares", "1", "--precision", "bf16", "--time-limit", "10", "--no-eager",
         "--loss-chunks", "2",
         "--budgets-out", str(out / "budgets.json"), "--budget-shares", "0.5",
         "--profile-chunks", "2"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    # the chunked graph is the one profiled: priced once, not again as another process's
    priced = re.findall(r"(\d+) kernels of GPT2/train have no profile",
                        done.stdout + done.stderr)
    assert len(set(priced)) == 1, priced
    bench = _script("trainer_bench")
    net, loss_fn, data = bench.model_and_data("gpt2", 2, 32, 1, small=True)
    from autotm_py.ir.training import derive_training
    from autotm_py.trainer.core import capture_training
    from autotm_py.trainer.spec import split_example
    forward, rule, spec, _ = capture_training(net, bench.sgd(net.parameters()), loss_fn,
                                              split_example(data[0]), "bf16")
    plain, chunked = (derive_training(forward, optimizer=spec, loss=rule, loss_chunks=n)
                      for n in (1, 2))
    assert plain.peak_live_bytes != chunked.peak_live_bytes
    budgets = json.loads((out / "budgets.json").read_text())
    assert budgets["peak_bytes"] == plain.peak_live_bytes
    (row,) = json.loads((out / "ours_1.json").read_text())["rows"]
    assert row["ours"]["peak_bytes"] == chunked.peak_live_bytes


def test_bf16_summary_of_an_fp32_run_checks_issue_44s_targets(tmp_path):
    """`PRECISION=fp32 bash experiments/gpu/bf16_bench.sh` (issue 44 item 6): the natives are
    named without autocast, and every budget of ours is held to within 1.15x of native eager and
    faster than each native option that fits its cap."""
    summary = _script("bf16_summary")
    native = {"model": "gpt2", "args": {"precision": "fp32"}, "eager": {"step_s": 0.100},
              "native": {"checkpoint": {"0.5": {"median_s": 0.150, "cap": 10},
                                        "0.25": {"median_s": None, "out_of_memory": True}},
                         "compile": {"0.1": {"0.5": {"median_s": 0.105, "cap": 10}}}}}
    (tmp_path / "native.json").write_text(json.dumps(native))
    for share, step in ((1, 0.101), (0.5, 0.110), (0.25, 0.120)):
        ours = {"model": "gpt2", "rows": [{"share": share, "ours": {
            "step_s": step, "predicted_s": step * 1.02, "budget_bytes": 100,
            "reserved_peak_bytes": 90}}]}
        (tmp_path / f"ours_{share}.json").write_text(json.dumps(ours))
    rows = summary.rows_of(tmp_path)
    assert {r["option"] for r in rows} == {"eager", "ours", "checkpointing",
                                           "torch.compile amb 0.1"}
    lines = summary.targets(rows)
    assert lines[:5] == [
        "all fast: 101.00 ms, 1.010x eager 100.00 ms (met: within 1.15x)",
        "50%: 110.00 ms, 1.100x eager 100.00 ms (met: within 1.15x)",
        "50%: native options that fit: 2 checkpointing 150.00 ms, torch.compile amb 0.1 "
        "105.00 ms (missed: faster than each)",
        "25%: 120.00 ms, 1.200x eager 100.00 ms (missed: within 1.15x)",
        "25%: native options that fit: 0  (met: faster than each)"]
    assert lines[5].startswith("prediction error median 2.0% over 3 (met")


@pytest.mark.parametrize("more", [{}, {"PRECISION": "fp32", "BATCH": "3"}])
def test_bf16_bench_can_profile_alone_before_the_bench(tmp_path, more):
    """bf16_bench.sh's first stage (PROFILE_FIRST, the default): one process of its own runs
    the Trainer all fast (its kernels profiled with the capped graph's chunked loss, four
    steps) before the bench's processes start; PROFILE_ONLY=1 stops after it. On the CPU at
    toy sizes (SMOKE=1); PRECISION and BATCH reach every process (issue 44's fp32 runs)."""
    env = {**os.environ, "SMOKE": "1", "PROFILE_ONLY": "1", "LIMIT": "5", "STEPS": "4", **more}
    done = subprocess.run(["bash", "experiments/gpu/bf16_bench.sh", str(tmp_path), "gpt2"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "profiled first" in done.stdout and "failed" not in done.stdout
    out = tmp_path / "gpt2"
    first = json.loads((out / "profile_first.json").read_text())
    (row,) = first["rows"]
    assert row["share"] == 1 and len(row["ours"]["losses"]) == 4
    assert first["args"]["profile_chunks"] == 16 and (out / "profiled_first").exists()
    assert (first["args"]["precision"], first["args"]["batch"]) == \
        (more.get("PRECISION", "bf16"), int(more.get("BATCH", 2)))
    assert not list(out.glob("ours_*.json")) and not (out / "native.json").exists()


def test_trainer_bench_times_nothing_before_every_process_is_ready(tmp_path, capsys):
    """bf16_bench.sh's processes share a GPU and a host: none times a step while another still
    captures, profiles, solves or compiles (`--ready-dir`, `--parties`), and one that ends,
    even by an error, holds no other up."""
    import threading
    import time
    from types import SimpleNamespace

    tb = _script("trainer_bench")
    ready = tmp_path / "ready"
    args = SimpleNamespace(ready_dir=str(ready), parties=2, wait_s=30.0)
    other = threading.Timer(1.0, lambda: (ready / "ready.other").touch())
    other.start()
    started = time.monotonic()
    tb.quiet(args)
    assert time.monotonic() - started >= 0.9  # waited for the other process
    assert len(list(ready.glob("ready.*"))) == 2
    started = time.monotonic()
    tb.quiet(args)  # once per process
    assert time.monotonic() - started < 0.5
    tb.quiet(SimpleNamespace(ready_dir=str(tmp_path / "alone"), parties=3, wait_s=0.5))
    assert "for 3 processes to be ready: timing anyway" in capsys.readouterr().out
    ended = tmp_path / "ended"
    with pytest.raises(SystemExit):  # --native without caps: refused inside the run
        tb.main([str(tmp_path / "x.json"), "--native", "--device", "cpu", "--ready-dir",
                 str(ended), "--parties", "5"])
    assert len(list(ended.glob("ready.*"))) == 1


def test_trainer_kernels_splits_a_steps_host_time_into_its_phases():
    """trainer_kernels.py's `host_phases`, on the CPU's eager Trainer: the executor's prepare,
    the iteration's launch (here the whole eager run) and the rest, which add up to the step."""
    import tempfile

    import torch

    from autotm_py.trainer import Trainer

    tk = _script("trainer_kernels")
    tb = _script("trainer_bench")
    net, loss_fn, data = tb.model_and_data("tiny", 32, 8, 4)
    trainer = Trainer(net, tb.sgd(net.parameters()), loss_fn, example=data[0], device="cpu",
                      ratio="1:0", plans_dir=tempfile.mkdtemp())
    phases = tk.host_phases(trainer, data)
    assert phases["prepare_ms"] > 0 and phases["launch_ms"] > 0 and phases["rest_ms"] >= 0
    assert phases["prepare_ms"] + phases["launch_ms"] + phases["rest_ms"] == \
        pytest.approx(phases["step_ms"])
    assert trainer.steps == 4 and isinstance(trainer.step(*data[0]), torch.Tensor)
    assert "prepare" not in vars(trainer.loop.executor)  # the timers are gone


def test_trainer_kernels_counts_the_outputs_copied_into_their_slots_by_op():
    """trainer_kernels.py's `slot_copies`, on the CPU's Trainer in an arena (no placed
    allocator there: every output placed in a slot is a copy): the first step's copies by op,
    as many as the executor counted, and the step's own methods back afterwards."""
    import tempfile

    from autotm_py.options import RunMode
    from autotm_py.trainer import Trainer

    tk = _script("trainer_kernels")
    tb = _script("trainer_bench")
    net, loss_fn, data = tb.model_and_data("tiny", 32, 8, 2)
    trainer = Trainer(net, tb.sgd(net.parameters()), loss_fn, example=data[0], device="cpu",
                      ratio="1:0", plans_dir=tempfile.mkdtemp(), mode=RunMode(arena=True))
    found = tk.slot_copies(trainer, data[0])
    ex = trainer.loop.executor
    assert found and "?" not in found and sum(found.values()) == ex.state.copied
    assert {"Gemm", "GemmGradB"} <= set(found), found
    assert "_in_slot" not in vars(ex) and "finish" not in vars(ex)
    assert trainer.steps == 1


def test_beyond_card_trains_its_small_decoder_under_a_budget_and_writes_every_step(tmp_path):
    """Issue 49's harness on the CPU (`--small`): the Trainer's part writes its losses, step
    times, plan facts and host peak, and says each step as it goes (a device call cut short
    still reports what it measured)."""
    out = tmp_path / "ours.json"
    run = subprocess.run([sys.executable, str(ROOT / "experiments" / "gpu" / "beyond_card.py"),
                          str(out), "--small", "--part", "ours", "--steps", "3",
                          "--plans", str(tmp_path / "plans")],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert len(re.findall(r"^step \d: loss", run.stdout, re.M)) == 3
    row = json.loads(out.read_text())["ours"]
    assert len(row["losses"]) == 3 and all(x > 0 for x in row["losses"])
    assert row["budget_bytes"] < row["peak_bytes"] and "moves" in row["describe"]
    assert row["host_peak_bytes"] > 0 and row["tokens_per_s"] > 0
    # where host memory went, phase by phase (the kind of gap the 5.12B decoder's pinned pool
    # left, rounded up to a power of two by torch)
    marks = row["host_memory"]["marks"]
    assert [m["phase"] for m in marks] == ["start", "module built", "trainer set up", "step 1",
                                           "step 2", "steps done"]
    assert all(m["rss"] > 0 and m["available"] > 0 for m in marks)
    assert "host memory, trainer set up: rss" in run.stdout


def test_beyond_card_calls_run_their_parts_with_their_options(tmp_path):
    """experiments/gpu/beyond_card_calls.sh (issue 49's device calls): each call runs its
    parts of beyond_card.py, one process each, with the options the docs name, and records
    every part's exit in machine.txt; an unknown call is refused. A stand-in python3 records
    how it was called (the real parts need the GPU)."""
    env = _stand_in_python(tmp_path, 'echo "$*"')

    def call(name: str) -> subprocess.CompletedProcess:
        out = tmp_path / name
        out.mkdir()
        return subprocess.run(["bash", "experiments/gpu/beyond_card_calls.sh", name, str(out)],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)

    assert call("split").returncode == 0
    machine = (tmp_path / "split" / "machine.txt").read_text()
    assert "uncapped_b4: exit 0" in machine and "split70_b16: exit 0" in machine
    assert "--part uncapped --batch 8" in (tmp_path / "split" / "uncapped_b8.log").read_text()
    split = (tmp_path / "split" / "split70_b16.log").read_text()
    assert "--part ours --cap 24GiB" in split and "--batch 16" in split
    assert "--optimizer-on split --host-share 0.7" in split
    assert call("host").returncode == 0
    assert "--part fsdp --cap 24GiB --batch 8" in (tmp_path / "host" / "fsdp_b8.log").read_text()
    assert call("eighty").returncode == 0  # no nvidia-smi here: the 80 GiB of the issue
    eighty = (tmp_path / "eighty" / "card_7b_80_b4.log").read_text()
    assert "--cap 80GiB" in eighty and "--size 7b" in eighty and "--optimizer-on gpu" in eighty
    assert "-k split" in (tmp_path / "eighty" / "tests.log").read_text()
    # an H100 80GB (81,559 MiB) has no 80 GiB to give: its whole card less 3 GiB; `card` runs
    # the decoder alone, SIZE picking it
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 81559\n")
    smi.chmod(0o755)
    env["SIZE"] = "8b"
    assert call("card").returncode == 0
    card = (tmp_path / "card" / "card_8b_76_b4.log").read_text()
    assert "--cap 76GiB" in card and "--size 8b" in card
    assert not (tmp_path / "card" / "tests.log").exists()
    refused = call("nine")
    assert refused.returncode == 2 and "unknown call nine" in refused.stderr


def test_repredict_beyond_plans_and_predicts_the_trainers_graph(tmp_path):
    """experiments/gpu/repredict_beyond.py --solve on the CPU (the small decoder): the
    Trainer's graph rebuilt, planned and simulated, the host's work and both ends printed; the
    plan cache of a call (`--plans`) without a plan of this graph says so."""
    script = "experiments/gpu/repredict_beyond.py"
    common = ["--size", "small", "--batch", "1", "--cap", "70MiB", "--gpu", "h200"]
    done = subprocess.run([sys.executable, script, *common, "--solve", "--time-limit", "10"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "optimizer updates on the host: " in done.stdout
    assert "(the GPU's part ends at " in done.stdout
    done = subprocess.run([sys.executable, script, *common, "--plans", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "no plan of this graph" in done.stdout


@pytest.mark.parametrize("name, block, shapes, classes", [
    ("unet_small", "dec1", ((2, 3, 32, 32), (2, 32, 32)), 3),
    ("lstm_classifier", "lstm", ((4, 12), (4,)), 5)])
def test_native_checkpointing_of_a_corpus_model_gives_eager_gradients(
        monkeypatch, name, block, shapes, classes):
    """native_compare.py's reference for a corpus model (the torch module the corpus exports):
    with its blocks under torch.utils.checkpoint (the U-Net's double convolutions, the LSTM's
    recurrent layers), one SGD step gives the eager step's parameters, and the labels are one
    class per output position."""
    import torch

    native = _script("native_compare")
    monkeypatch.setattr(native, "DEV", "cpu")
    monkeypatch.setattr(native, "SCALE", "small")
    stepped = []
    for segments in (None, 1):
        net, make, loss = native.native_model(name, shapes[0][0], {})
        torch.manual_seed(3)
        native.native_step(name, net, make, loss, segments)()
        stepped.append(net)
    eager, checkpointed = stepped
    assert isinstance(getattr(checkpointed, block), native.Checkpointed)
    assert not isinstance(getattr(eager, block), native.Checkpointed)
    for a, b in zip(eager.parameters(), checkpointed.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    x, labels = native.native_model(name, shapes[0][0], {})[1]()
    assert (tuple(x.shape), tuple(labels.shape)) == shapes
    assert int(labels.max()) < classes
