"""The device's busy time of a profiled iteration (`runtime.device_trace`, issue 14 item 4's
measure): the arithmetic on synthetic events here, the profile itself on a GPU
(tests/test_placed_gpu.py, marked gpu)."""

import pytest

from autotm_py import api
from autotm_py.cli import main
from autotm_py.config import PlanConfig
from autotm_py.errors import ConfigError
from autotm_py.runtime.device_trace import activity_of, union_length
from tests.test_report_support import tiny_onnx


def test_union_counts_overlaps_once_and_gaps_not_at_all():
    assert union_length([]) == 0
    assert union_length([(0, 10), (5, 15), (20, 30)]) == 25  # 0-15 and 20-30
    assert union_length([(20, 30), (0, 10), (2, 3)]) == 20  # order and nesting do not matter
    assert union_length([(0, 10), (10, 12)]) == 12  # touching intervals join


def test_activity_separates_kernels_copies_and_idle_time():
    events = [("volta_sgemm", 0, 100), ("Memcpy HtoD (Pageable -> Device)", 50, 100),
              ("Memset (Device)", 300, 10), ("relu_kernel", 400, 100)]
    a = activity_of(events)
    assert a.events == 4
    assert a.span_s == pytest.approx(500e-9)
    assert a.busy_s == pytest.approx(260e-9)  # 0-150, 300-310, 400-500
    assert a.kernel_s == pytest.approx(200e-9) and a.copy_s == pytest.approx(110e-9)
    assert activity_of([]).busy_s == 0.0


@pytest.fixture(scope="module")
def model_and_plan(tmp_path_factory):
    path = tiny_onnx(tmp_path_factory.mktemp("m") / "tiny.onnx", hidden=64, layers=2)
    graph = api.load_model(path, training=True)
    plan = api.optimize(graph, PlanConfig(strategy="sync", ratio="1:1")).plan
    plan_path = tmp_path_factory.mktemp("p") / "plan.json"
    plan.save(plan_path)
    return path, graph, plan, plan_path


def test_device_busy_needs_a_gpu(model_and_plan, capsys):
    path, graph, plan, plan_path = model_and_plan
    with pytest.raises(ConfigError, match=r"--device-busy .* needs --device cuda"):
        api.execute(graph, plan, device="cpu", device_busy=True)
    code = main(["run", path, "--training", "--plan", str(plan_path), "--device", "cpu",
                 "--device-busy"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1 and "--device-busy" in err[0]


def test_the_package_exports_the_cuda_process_setup_for_api_runs(model_and_plan):
    """`at.prepare_cuda_process` (docs/user-guide.md, Python API) is exported; off CUDA it
    installs nothing and says nothing."""
    import autotm_py as at

    _, _, plan, _ = model_and_plan
    assert "prepare_cuda_process" in at.__all__ and "RunMode" in at.__all__
    assert at.prepare_cuda_process(plan, "cpu", at.RunMode(arena=True, replay=True)) == []
