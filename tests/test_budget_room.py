"""A plan's budget against the GPU memory it may take (`runtime.device.check_budget_room`):
more is a one-line error naming who gave it and the largest that fits, before anything is
placed (the GPU side: tests/test_trainer_gpu.py)."""

import pytest

from autotm_py.errors import ConfigError
from autotm_py.runtime import device

GIB = 1 << 30


def test_a_budget_beyond_the_room_names_the_face_and_the_largest_that_fits(monkeypatch):
    monkeypatch.setattr(device, "gpu_room_bytes", lambda dev: 77 * GIB)
    monkeypatch.setattr(device, "device_name", lambda dev: "NVIDIA H100 80GB HBM3")
    with pytest.raises(ConfigError) as err:
        device.check_budget_room(80 * GIB, "cuda", "Trainer")
    assert str(err.value) == (
        "Trainer: the budget 80.00 GiB is more than the 77.00 GiB of GPU memory a plan may "
        "take on this NVIDIA H100 80GB HBM3 (its free memory less CUDA's and cuBLAS's own); "
        "give a budget of at most 77.00 GiB")
    device.check_budget_room(77 * GIB, "cuda", "Trainer")  # within: nothing said
    device.check_budget_room(None, "cuda", "Trainer")  # no budget: nothing to check
    with pytest.raises(ConfigError, match=r"^the budget 80\.00 GiB"):  # the caller names itself
        device.check_budget_room(80 * GIB, "cuda", None)


def test_the_cpu_has_no_room_to_check(monkeypatch):
    def room(dev):
        raise AssertionError("no GPU is asked on the CPU")

    monkeypatch.setattr(device, "gpu_room_bytes", room)
    device.check_budget_room(10**15, "cpu", "Trainer")


def test_a_trainers_budget_is_read_before_the_capture():
    """A budget the Trainer cannot read is refused at once, named as the Trainer's argument
    (the room check of a readable one runs there too, on a GPU: tests/test_trainer_gpu.py)."""
    import torch

    from autotm_py.trainer import Trainer

    module = torch.nn.Linear(4, 2)
    with pytest.raises(ConfigError, match=r"^Trainer: budget 'lots': expected a size"):
        Trainer(module, torch.optim.SGD(module.parameters(), lr=0.1),
                torch.nn.functional.cross_entropy,
                example=(torch.zeros(8, 4), torch.zeros(8, dtype=torch.long)),
                budget="lots", device="cpu")
