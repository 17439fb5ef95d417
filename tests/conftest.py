"""Test-wide settings.

Unit tests plan synthetic graphs of a few KiB with the GPU presets. The presets' runtime
reserve (tens of MiB that torch's cuBLAS workspaces take on a real GPU) would leave such graphs
no room at all, so tests run with the reserve at 0, except tests marked `runtime_reserve`, which
check the reserve itself (tests/test_memory.py).

Randomized (hypothesis) checks run as much as the profile in `AUTOTM_HYPOTHESIS` says
(`tests/randomized.py`; default `dev`). One Ctrl-C stops a run (`randomized.keep_ctrl_c`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from autotm_py.memory import tiers
from tests.fixtures.cli import net  # noqa: F401  (the CLI tests' small graph, by name)
from tests.fixtures.profiles import (  # noqa: F401  (bf16 priced from fp32, by name)
    fp32_only_shipped,
    fp32_only_shipped_module,
)
from tests.randomized import register_and_load

_REAL_PRESETS = dict(tiers.PRESETS)

# hypothesis profiles (AUTOTM_HYPOTHESIS=dev|slow|nightly), and no hypothesis gc callback to
# swallow a Ctrl-C (tests/randomized.py)
register_and_load()


@pytest.fixture(autouse=True, scope="session")
def _no_runtime_reserve() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tiers, "PRESETS", {name: replace(m, runtime_reserve_bytes=0)
                                      for name, m in _REAL_PRESETS.items()})
        yield


@pytest.fixture(autouse=True)
def _real_reserve_when_marked(request: pytest.FixtureRequest,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    if request.node.get_closest_marker("runtime_reserve"):
        monkeypatch.setattr(tiers, "PRESETS", dict(_REAL_PRESETS))
