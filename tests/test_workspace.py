"""Kernel workspace: measured by the CUDA profiler, carried by the profile cache and the
costs, and counted by the capacity rows of the machine model."""

from __future__ import annotations

import pytest

from autotm_py.costs import KernelCosts
from autotm_py.machine import MachineModel
from autotm_py.memory.tiers import preset
from autotm_py.profiling.cache import ProfileEntry
from tests.synthetic import chain


def test_profile_entry_round_trips_workspace():
    entry = ProfileEntry(1e-3, 9e-4, 2e-3, 5, workspace_bytes=12345)
    assert ProfileEntry.from_dict(entry.to_dict()).workspace_bytes == 12345
    assert "workspace_bytes" not in ProfileEntry(1e-3, 9e-4, 2e-3, 5).to_dict()


def test_machine_model_counts_measured_workspace():
    graph = chain(3, size=1024)
    costs = KernelCosts.from_times("cuda", [1e-3] * 3)
    plain = MachineModel(graph, preset("h100-pcie5"), costs)
    measured = MachineModel(graph, preset("h100-pcie5"),
                            KernelCosts(**{**costs.__dict__,
                                           "workspace_bytes": (0, 1 << 20, 0)}))
    assert plain.workspace.tolist() == [0, 0, 0]
    assert measured.workspace[1] >= 1 << 20
    assert measured.peak[0] >= plain.peak[0] + (1 << 20)


@pytest.mark.gpu
def test_cuda_workspace_of_a_matmul_is_measured():
    import torch

    from autotm_py.ir import GraphBuilder, Role
    from autotm_py.profiling.torch_profiler import measure_workspace

    b = GraphBuilder("mm")
    x = b.add_tensor("x", (512, 512), "float32", Role.INPUT)
    y = b.add_tensor("y", (512, 512), "float32", Role.OUTPUT)
    b.add_kernel("Softmax", [x], [y], attrs={"axis": -1})
    b.outputs.append(y)
    graph = b.build()
    args = [torch.randn(512, 512, device="cuda")]
    ws = measure_workspace(graph.kernels[0], args, device="cuda")
    assert ws is not None and ws >= 0
    assert measure_workspace(graph.kernels[0], [args[0].cpu()], device="cpu") is None
