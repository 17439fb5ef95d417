"""The same training checks on a CUDA device (run on the device machine: `-m gpu`).

Our kernels on CUDA equal torch.autograd on CUDA (same tolerance as on the CPU; TF32 off so
both sides round like float32), and two runs are bitwise equal under deterministic
algorithms, which is what the plan executor relies on."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from autotm_py.ir.training import derive_training
from autotm_py.runtime.reference import train_steps
from tests.test_training_models import MODELS
from tests.test_training_ops import CASES, Case, _case_id, compare_training, op_graph

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def exact_cuda() -> Iterator[None]:
    flags = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.backends.cudnn.deterministic, torch.are_deterministic_algorithms_enabled())
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.deterministic = True
    torch.use_deterministic_algorithms(True, warn_only=True)  # 3-d max-pool backward has none
    yield
    (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
     torch.backends.cudnn.deterministic) = flags[:3]
    torch.use_deterministic_algorithms(flags[3])


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_op_backward_matches_autograd_on_cuda(case: Case) -> None:
    graph, fixed = op_graph(case)
    compare_training(graph, fixed=fixed, device="cuda", loss=case.loss)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("model", sorted(MODELS))
def test_model_trains_like_autograd_on_cuda(model: str, optimizer: str) -> None:
    compare_training(MODELS[model](), steps=3, optimizer=optimizer, device="cuda")


@pytest.mark.parametrize("model", sorted(MODELS))
def test_cuda_runs_are_bitwise_equal_and_close_to_cpu(model: str) -> None:
    train = derive_training(MODELS[model](), optimizer="adam")
    first = train_steps(train, steps=2, seed=3, device="cuda")
    second = train_steps(train, steps=2, seed=3, device="cuda")
    cpu = train_steps(train, steps=2, seed=3, device="cpu")
    # dropout masks are drawn on the host: the same on every device
    loss = train.meta["training"]["loss"]
    for a, b, c in zip(first, second, cpu, strict=True):
        assert all(torch.equal(a[t], b[t]) for t in a)
        assert torch.allclose(a[loss].cpu(), c[loss], rtol=1e-4)
