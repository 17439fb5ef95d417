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


def test_in_context_entries_belong_to_their_graph(tmp_path):
    """An entry stored under "<placement>@<model hash>" serves that graph only; other graphs
    with the same kernel signature keep the isolated time."""
    from autotm_py.profiling.cache import ProfileEntry, write_entries
    from autotm_py.profiling.fingerprint import target_fingerprint
    from autotm_py.profiling.in_context import context_key
    from autotm_py.profiling.profile import load_costs
    from autotm_py.profiling.sources import all_fast
    from tests.synthetic import chain

    one, other = chain(3), chain(4)  # same Relu signature, different graphs
    kernel = one.kernels[0]
    assert kernel.signature == other.kernels[0].signature
    fp = target_fingerprint("cuda")
    isolated = {kernel.signature: {all_fast(kernel): ProfileEntry(2e-3, 2e-3, 2e-3, 3)}}
    in_ctx = {kernel.signature: {f"{all_fast(kernel)}@{context_key(one)}":
                                 ProfileEntry(1e-3, 1e-3, 1e-3, 3, context=context_key(one))}}
    write_entries(tmp_path / "gpu.json", fp, isolated)
    write_entries(tmp_path / "gpu.json", fp, in_ctx)
    shipped = tmp_path / "none"
    assert load_costs(one, device="cuda", profiles_dir=tmp_path,
                      shipped_dir=shipped).times_s[0] == 1e-3
    assert load_costs(other, device="cuda", profiles_dir=tmp_path,
                      shipped_dir=shipped).times_s[0] == 2e-3


def test_event_overhead_is_taken_off_every_kernel_evenly():
    """Events stretched the instrumented iteration from 9 to 12: 1 comes off each kernel, but a
    kernel keeps at least half its time."""
    from autotm_py.profiling.in_context import remove_event_overhead

    corrected, share = remove_event_overhead([[1.0, 1.5, 9.5], [1.0, 1.5, 9.5]], 9.0)
    assert share == pytest.approx(1.0)
    assert corrected[0] == pytest.approx([0.5, 0.75, 8.5])
    # an uninstrumented run that is slower (noise) takes nothing off
    assert remove_event_overhead([[1.0, 2.0]], 5.0) == ([[1.0, 2.0]], 0.0)
