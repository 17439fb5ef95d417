"""A plan's re-run of a training-mode batch norm applies the statistics its first run saved
(`ir.rerun`): it reads X, the scale, the bias and the saved mean and invstd, never a running
statistic, regenerates only Y, bit for bit the first run's, and is priced as the pass it is on a
GPU. The CUDA kernels are checked on a GPU in tests/test_batch_norm_gpu.py."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from autotm_py.config import PlanConfig
from autotm_py.errors import PlanError
from autotm_py.ir.graph import Kernel, freeze_attrs
from autotm_py.ir.layout import to_channels_last
from autotm_py.ir.precision import with_precision
from autotm_py.ir.rerun import APPLY_SHARE, BN_APPLY, rerun_kernel, rerun_share
from autotm_py.ir.training import derive_training
from autotm_py.kernels import run_kernel
from autotm_py.kernels.into import run_kernel_into
from autotm_py.pipeline import machine_for, optimize
from autotm_py.plan import Compute, Recompute
from autotm_py.planning.recompute import recompute_spec
from tests.graphs import costs_for
from tests.test_training_models import small_cnn

BN = Kernel(0, "bn", "BatchNormalization", "", freeze_attrs(
    {"epsilon": 1e-5, "momentum": 0.9, "training_mode": 1}), (0, 1, 2, 3, 4), (5, 6, 7, 8, 9), "")


def _cnn(precision: str = "fp32"):
    return derive_training(with_precision(small_cnn(), precision), optimizer="sgd")


def _batch_norms(graph):
    return [k for k in graph.kernels if k.op_type == "BatchNormalization"]


@pytest.mark.parametrize(("dtype", "fmt"), [
    (torch.float32, torch.contiguous_format), (torch.float32, torch.channels_last),
    (torch.bfloat16, torch.contiguous_format), (torch.bfloat16, torch.channels_last)])
def test_the_re_run_gives_the_first_runs_y_bit_for_bit(dtype, fmt):
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(6, 8, 7, 5, generator=gen) * 3 + 1).to(dtype).contiguous(memory_format=fmt)
    scale, bias = torch.rand(8, generator=gen) + 0.5, torch.randn(8, generator=gen)
    mean, var = torch.randn(8, generator=gen), torch.rand(8, generator=gen) + 0.5
    first = BN if fmt == torch.contiguous_format else replace(BN, channels_last=(0,))
    y, _, _, saved_mean, saved_invstd = run_kernel(first, [x, scale, bias, mean, var])
    again = rerun_kernel(first)
    args = [x, scale, bias, saved_mean, saved_invstd]
    (regenerated,) = run_kernel(again, args)
    assert torch.equal(regenerated, y)
    slot = torch.full_like(y, float("nan"))
    assert run_kernel_into(again, args, [slot]) and torch.equal(slot, y)


def test_on_cudnns_path_the_re_run_is_the_first_runs_call_again(monkeypatch):
    """Where cuDNN's pair runs the batch norm (forced here; its ops run their CPU kernels) the
    re-run calls it again on throwaway running statistics: the same Y, the real running
    statistics untouched."""
    from autotm_py.kernels import batch_norm

    monkeypatch.setattr(batch_norm, "cudnn_batch_norm", lambda x, scale, eps: True)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(4, 6, 5, 5, generator=gen)
    scale, bias = torch.rand(6, generator=gen) + 0.5, torch.randn(6, generator=gen)
    mean, var = torch.randn(6, generator=gen), torch.rand(6, generator=gen) + 0.5
    y, new_mean, new_var, saved_mean, saved_invstd = run_kernel(BN, [x, scale, bias, mean, var])
    kept = (new_mean.clone(), new_var.clone())
    (regenerated,) = run_kernel(rerun_kernel(BN), [x, scale, bias, saved_mean, saved_invstd])
    assert torch.equal(regenerated, y)
    assert torch.equal(new_mean, kept[0]) and torch.equal(new_var, kept[1])


def test_a_batch_norm_is_re_run_from_its_saved_statistics_and_other_kernels_as_they_ran():
    again = rerun_kernel(BN)
    assert (again.op_type, again.id, again.name) == (BN_APPLY, BN.id, BN.name)
    assert again.inputs == (0, 1, 2, 8, 9) and again.outputs == (5,)
    inference = replace(BN, attrs=freeze_attrs({"epsilon": 1e-5}), outputs=(5,))
    graph = _cnn()
    relu = next(k for k in graph.kernels if k.op_type == "Relu")
    assert rerun_kernel(inference) is inference and rerun_kernel(relu) is relu


def test_the_re_run_is_priced_as_one_pass_where_torch_runs_its_native_kernel():
    """On a GPU: 2/3 of the batch norm's time where torch runs its native kernel (bf16,
    channels-last), the whole of it where cuDNN's runs (fp32 row-major); always the whole on
    the CPU, where the re-run is the first run's kernel again."""
    graph = _cnn()
    bf16 = _cnn("bf16")
    for g, gpu, share in ((graph, True, 1.0), (to_channels_last(graph), True, APPLY_SHARE),
                          (bf16, True, APPLY_SHARE), (bf16, False, 1.0)):
        assert {rerun_share(g, k, gpu=gpu) for k in _batch_norms(g)} == {share}
    machine = machine_for(bf16, PlanConfig(fast_mem_bytes=bf16.peak_live_bytes, device="cuda"),
                          costs_for(bf16))
    kid = _batch_norms(bf16)[0].id
    assert machine.rerun_time(kid) == pytest.approx(machine.fast_time(kid) * APPLY_SHARE)


def test_regenerations_of_a_batch_norm_need_its_saved_statistics_not_its_running_ones():
    graph = _cnn()
    machine = machine_for(graph, PlanConfig(fast_mem_bytes=graph.peak_live_bytes // 2,
                                            device="cuda"), costs_for(graph))
    spec = recompute_spec(machine, depth=3, ratio=None)
    for bn in _batch_norms(graph):
        assert bn.outputs[0] in spec.regen  # through a ReLU, or an Add and a ReLU
        assert not set(bn.outputs[1:]) & set(spec.regen), "only Y is regenerated"
        points = spec.regen[bn.outputs[0]]
        for running in bn.inputs[3:]:
            assert not spec.needs.get(running, frozenset()) & points
        for saved in bn.outputs[3:]:
            assert points <= spec.needs[saved]


def test_a_plan_that_regenerates_saved_statistics_is_refused():
    graph = _cnn()
    budget = (graph.max_working_set[0] + graph.peak_live_bytes) // 2
    plan = optimize(graph, PlanConfig(fast_mem_bytes=budget, device="cuda", recompute="on",
                                      solver="highs"), costs=costs_for(graph, scale_s=2e-6)).plan
    assert plan is not None
    bn = _batch_norms(graph)[0]
    at = next(i for i, r in enumerate(plan.records) if getattr(r, "kernel", None) == bn.id)
    records = list(plan.records)
    before = next(r.kernel for r in records[at + 1:] if isinstance(r, Compute))
    records.insert(at + 1, Recompute(bn.id, (bn.outputs[3],), before))
    with pytest.raises(PlanError, match=r"not an output of kernel #\d+'s re-run"):
        replace(plan, records=tuple(records)).validate(graph)
