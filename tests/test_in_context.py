"""In-context profiling: kernel times measured inside whole iterations (CUDA, marked `gpu`)
sum to the measured iteration; on the CPU the option is refused with a clear error."""

from __future__ import annotations

import pytest

from autotm_py.errors import ProfileError
from autotm_py.profiling.in_context import all_fast_plan, profile_in_context
from tests.test_executor import _graph


def test_all_fast_plan_frees_and_moves_nothing():
    graph = _graph("cnn")
    plan = all_fast_plan(graph)
    plan.validate(graph)
    assert not list(plan.moves())
    assert sum(1 for _ in plan.computes()) == len(graph.kernels)


def test_in_context_needs_cuda(tmp_path):
    with pytest.raises(ProfileError, match="needs --device cuda"):
        profile_in_context(_graph("cnn"), device="cpu", profiles_dir=tmp_path)


@pytest.mark.gpu
def test_in_context_times_sum_to_the_iteration(tmp_path):
    graph = _graph("cnn")
    costs = profile_in_context(graph, device="cuda", profiles_dir=tmp_path, iterations=7)
    assert costs.n_estimated == 0 and costs.n_scaled == 0
    # per-signature medians of consecutive-event intervals: they sum to the iteration measured
    # in the same runs (medians of a few runs of a tiny graph: a loose tolerance)
    assert costs.total_s == pytest.approx(costs.summary["iteration_median_s"], rel=0.25)
