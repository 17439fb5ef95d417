"""Planning in bf16 as quickly as in fp32 (issue 46 item 1, docs/precision.md "How quickly a
bf16 plan is found"): a bf16 kernel is priced from the same fp32 measurement as its fp32 twin,
so the bf16 graph gets no workspace the fp32 one does not have."""

from __future__ import annotations

import pytest

from autotm_py import api
from autotm_py.options import ModelOptions
from autotm_py.profiling.costmodel import OpShape
from autotm_py.profiling.profile import cost_sources, target_fingerprint
from autotm_py.profiling.scaling import scale_time
from autotm_py.profiling.sources import FROM_FP32, fp32_signature, graph_batch

# The README's quick start plans ResNet-50 training at batch 256, where the shipped H100
# profiles measured each convolution backward kernel's parts (ConvGradData, ConvGradFilter)
# and the whole ConvGrad at batch 32 only.
OPTIONS = {"batch": 256, "training": True}
# priced with the shipped H100 profile without its bf16 entries, which would serve these kernels
pytestmark = pytest.mark.usefixtures("fp32_only_shipped_module")


@pytest.fixture(scope="module")
def twins(fp32_only_shipped_module):
    fp32 = api.load_model("resnet50", ModelOptions(**OPTIONS))
    bf16 = api.load_model("resnet50", ModelOptions(**OPTIONS, precision="bf16"))
    return fp32, bf16, api.load_costs(fp32, device="cuda"), api.load_costs(bf16, device="cuda")


def test_bf16_kernels_are_priced_from_their_fp32_twins_entries(twins):
    """Every bf16 kernel with an fp32 twin (the kernel of the same name in the fp32 graph) is
    priced from what prices that twin, scaled by the roofline's work ratio, its workspace by
    the bytes ratio. Before the fix the bf16 ConvGrad skipped its fp32 parts (measured at 256)
    for the whole kernel measured at batch 32, whose workspace scaled by 8: up to 624 MiB."""
    fp32, bf16, c32, c16 = twins
    by_name = {k.name: k for k in fp32.kernels}
    sources = cost_sources("cuda", target_fingerprint("cuda"), None, None)
    roofline = sources.roofline
    checked = 0
    for k in bf16.kernels:
        twin = by_name.get(k.name)
        if twin is None or fp32_signature(k.signature) != twin.signature:
            continue
        assert sources.lookup(bf16, k, graph_batch(bf16)).how == FROM_FP32, k.name
        low, high = OpShape.of_kernel(bf16, k), OpShape.of_kernel(fp32, twin)
        measured = roofline.work_s(high)
        factor = roofline.work_s(low) / measured if measured > 0 else 1.0  # views: unscaled
        want = scale_time(c32.times_s[twin.id], factor, roofline.launch_s)
        assert c16.times_s[k.id] == pytest.approx(want, rel=1e-9), k.name
        assert c16.workspace_bytes[k.id] == \
            int(c32.workspace_bytes[twin.id] * low.bytes / high.bytes), k.name
        checked += 1
    assert checked >= 100
    grads = [k for k in bf16.kernels if k.op_type == "ConvGrad"]
    assert len(grads) == 52
    assert max(c16.workspace_bytes[k.id] for k in grads) < 2**20


def test_the_bf16_capacity_rows_count_no_workspace_the_fp32_ones_do_not(twins):
    """What the pricing gives the ILP: at the quick start's budget (1:4, an arena with scratch
    windows), a bf16 kernel has a scratch window of its own only where its fp32 twin has one,
    or where it is a cast (torch allocates a cast's output outside its slot). Before the fix
    the 52 ConvGrads had windows of up to 624 MiB in a 1.95 GiB budget, and the async search
    took 5 times as long as fp32's."""
    from autotm_py.config import PlanConfig
    from autotm_py.pipeline import machine_for
    from autotm_py.units import parse_ratio

    fp32, bf16, c32, c16 = twins
    config = PlanConfig(ratio=parse_ratio("1:4"))
    m32, m16 = machine_for(fp32, config, c32), machine_for(bf16, config, c16)
    assert m16.windowed
    windowed = {k.name for k in fp32.kernels if m32.windows[k.id]}
    extra = {k.op_type for k in bf16.kernels if m16.windows[k.id] and k.name not in windowed}
    assert extra <= {"Cast", "CastGrad"}, extra
