"""In-context profiling: kernel times measured inside whole iterations (CUDA, marked `gpu`)
sum to the measured iteration; on the CPU the option is refused with a clear error."""

from __future__ import annotations

import pytest

from autotm_py.errors import ProfileError
from autotm_py.pipeline import all_fast_plan, profile_in_context
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
    # device times come with them (one more iteration, every kernel in a profiler range):
    # the GPU work of every kernel but views and the SGD updates (the executor runs a run of
    # updates as one foreach launch at its first record, so the others launch nothing), and
    # no more than the iteration took
    launching = [(k.op_type, d) for k, d in zip(graph.kernels, costs.device_s, strict=True)
                 if k.op_type != "SGDUpdate"]
    assert sum(d > 0 for _, d in launching) >= 0.9 * len(launching), launching
    assert sum(costs.device_s) <= costs.summary["iteration_median_s"] * 1.1


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


def test_device_times_come_from_the_kernel_ranges():
    """The host-side range of each kernel carries the device time of what it launched; the
    device-side copy of a range is not counted twice; instances are summed per kernel id and
    a signature's entry takes the median over its instances."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    from autotm_py.profiling.in_context import kernel_device_times, per_signature_median
    from autotm_py.runtime.executor import KERNEL_RANGE

    def event(name, device, us, start=0.0, end=0.0, thread=1, parent=None):
        return SimpleNamespace(name=name, device_type=device, device_time_total=us,
                               time_range=SimpleNamespace(start=start, end=end),
                               thread=thread, cpu_parent=parent)

    events = [event(f"{KERNEL_RANGE}0", DeviceType.CPU, 30.0),
              event(f"{KERNEL_RANGE}0", DeviceType.CUDA, 30.0),  # the device-side copy
              event(f"{KERNEL_RANGE}2", DeviceType.CPU, 10.0),
              event("aten::relu", DeviceType.CPU, 99.0)]
    assert kernel_device_times(events, 3) == pytest.approx([30e-6, 0.0, 10e-6])
    graph = _graph("cnn")
    times = [1e-6 * (k.id + 1) for k in graph.kernels]
    medians = per_signature_median(graph, times)
    for signature in {k.signature for k in graph.kernels}:
        ids = [k.id for k in graph.kernels if k.signature == signature]
        assert medians[signature] == pytest.approx(sorted(times[i] for i in ids)[len(ids) // 2]
                                                   if len(ids) % 2 else
                                                   sum(sorted(times[i] for i in ids)
                                                       [len(ids) // 2 - 1:len(ids) // 2 + 1]) / 2)
    assert per_signature_median(graph, []) == {}


def test_device_times_count_what_autograds_device_thread_ran_inside_a_kernel():
    """A recurrent gradient kernel calls torch.autograd.grad, whose engine launches the
    backward from its own device thread: that work (top-level engine events of another
    thread, inside the kernel's range in time) is the kernel's; the engine's events of the
    kernel's own thread are already under its range, and other threads' work outside every
    range belongs to no kernel."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    from autotm_py.profiling.in_context import ENGINE_EVENT, kernel_device_times
    from autotm_py.runtime.executor import KERNEL_RANGE

    def event(name, us, start, end, thread, parent=None):
        return SimpleNamespace(name=name, device_type=DeviceType.CPU, device_time_total=us,
                               time_range=SimpleNamespace(start=start, end=end),
                               thread=thread, cpu_parent=parent)

    grad = event(f"{KERNEL_RANGE}1", 4300.0, 100.0, 900.0, thread=1)
    events = [event(f"{KERNEL_RANGE}0", 50.0, 0.0, 90.0, thread=1), grad,
              event(f"{ENGINE_EVENT}: CudnnRnnBackward0", 9600.0, 300.0, 880.0, thread=7),
              event(f"{ENGINE_EVENT}: MulBackward0", 20.0, 150.0, 160.0, thread=1,
                    parent=grad),  # on the kernel's own thread: inside its range already
              event(f"{ENGINE_EVENT}: AddBackward0", 70.0, 950.0, 990.0, thread=7),
              event("aten::copy_", 500.0, 400.0, 410.0, thread=9)]
    assert kernel_device_times(events, 2) == pytest.approx([50e-6, 13900e-6])


def test_kernel_ranges_wrap_every_kernel():
    """The executor's ranges (CPU here: the plumbing the CUDA device times rely on)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from autotm_py.runtime.execute import new_executor
    from autotm_py.runtime.executor import KERNEL_RANGE

    graph = _graph("cnn")
    _, executor, _ = new_executor(graph, all_fast_plan(graph), "cpu", seed=0,
                                deterministic=False, kernel_ranges=True)
    executor.prepare()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        executor.run()
    named = {e.name for e in prof.events() if e.name.startswith(KERNEL_RANGE)}
    assert named == {f"{KERNEL_RANGE}{k.id}" for k in graph.kernels}
    assert torch.is_tensor(executor.value(graph.outputs[0]))


def test_device_times_travel_from_profile_to_costs(tmp_path):
    """An in-context entry's device time reaches `KernelCosts.device_s`; without one the costs
    have none (the simulator then keeps one clock)."""
    from autotm_py.profiling.cache import ProfileEntry, write_entries
    from autotm_py.profiling.fingerprint import target_fingerprint
    from autotm_py.profiling.in_context import context_key
    from autotm_py.profiling.profile import load_costs
    from autotm_py.profiling.sources import all_fast
    from tests.synthetic import chain

    graph = chain(2)
    fp = target_fingerprint("cuda")
    key = context_key(graph)
    entry = ProfileEntry(1e-3, 1e-3, 1e-3, 3, context=key, device_s=2e-4)
    assert ProfileEntry.from_dict(entry.to_dict()) == entry
    write_entries(tmp_path / "gpu.json", fp,
                  {k.signature: {f"{all_fast(k)}@{key}": entry} for k in graph.kernels})
    shipped = tmp_path / "none"
    costs = load_costs(graph, device="cuda", profiles_dir=tmp_path, shipped_dir=shipped)
    assert costs.device_s == (2e-4,) * len(graph.kernels)
    other = tmp_path / "other"
    write_entries(other / "gpu.json", fp, {k.signature: {f"{all_fast(k)}@{key}": ProfileEntry(
        1e-3, 1e-3, 1e-3, 3, context=key)} for k in graph.kernels})
    assert load_costs(graph, device="cuda", profiles_dir=other, shipped_dir=shipped).device_s == ()


def test_kernels_measured_alone_keep_their_time_beside_in_context_ones(tmp_path):
    """Costs mixing in-context entries (with device times) and entries measured alone (a new
    kernel profiled in another graph, another device's set): a kernel measured alone costs
    its measured time on the GPU clock, not nothing; an in-context kernel without a device
    time launched nothing (0). Before, both were 0, and a chunked BERT-base graph whose two
    loss kernels came from an in-context profile was priced at a third of its time."""
    from autotm_py.profiling.cache import ProfileEntry, write_entries
    from autotm_py.profiling.fingerprint import target_fingerprint
    from autotm_py.profiling.in_context import context_key
    from autotm_py.profiling.profile import load_costs
    from autotm_py.profiling.sources import all_fast

    graph = _graph("cnn")
    first, second, *rest = list({k.signature: k for k in graph.kernels}.values())
    key = context_key(graph)
    fp = target_fingerprint("cuda")
    entries = {first.signature: {f"{all_fast(first)}@{key}": ProfileEntry(
                   1e-3, 1e-3, 1e-3, 3, context=key, device_s=2e-4)},
               second.signature: {f"{all_fast(second)}@{key}": ProfileEntry(
                   3e-6, 3e-6, 3e-6, 3, context=key)}}
    entries.update({k.signature: {all_fast(k): ProfileEntry(5e-4, 5e-4, 5e-4, 3)}
                    for k in rest})
    write_entries(tmp_path / "gpu.json", fp, entries)
    costs = load_costs(graph, device="cuda", profiles_dir=tmp_path,
                       shipped_dir=tmp_path / "none")
    by_signature = {k.signature: costs.device_s[k.id] for k in graph.kernels}
    assert by_signature[first.signature] == 2e-4
    assert by_signature[second.signature] == 0.0
    assert all(by_signature[k.signature] == 5e-4 for k in rest)
