"""How much the randomized (hypothesis) checks run: profiles chosen by `AUTOTM_HYPOTHESIS`.

=========  ===============================  ==============================================
profile    small problems (3-8 kernels)     large problems (100-500 kernels)
=========  ===============================  ==============================================
dev        15 examples per strategy         1 per (kind, strategy), 100-250 kernels
slow       1000 per strategy (CI)           60 per (kind, strategy), 100-500 kernels
nightly    5000 per strategy                300 per (kind, strategy), 100-500 kernels
=========  ===============================  ==============================================

`dev` is the default (a plain `pytest` run). CI sets ``AUTOTM_HYPOTHESIS=slow``; a nightly
job sets ``nightly`` (docs/developer.md gives the commands and wall times). Every profile has
no deadline (a solve's time varies with the machine's load) and prints the reproduction blob
of a failure. `tests/conftest.py` registers and loads the profile before any test module is
imported, so the `settings` decorators of the tests inherit it.

Ctrl-C: hypothesis times its garbage collections with a `gc.callbacks` function, installed on
the first test run and kept for good. A signal that arrives during a collection (frequent while
the planner builds its models) is handled by the first Python code to run after it, that
callback, where the KeyboardInterrupt is printed as "Exception ignored" and dropped: one Ctrl-C
in eight during the large planning checks did nothing, and two in a row could too. The timings
only serve hypothesis's deadlines, and no profile has one, so `keep_ctrl_c` removes the
callback before any test runs (tests/test_pytest_interrupt.py checks it).

`STRATEGIES` lists the planning strategies the checks cover, as plan names
(`PlanConfig.for_plan_name`: ``sync``/``async`` move only, ``sync+recompute``/
``async+recompute`` keep, move or recompute, ``recompute-only``), and the devices each is
checked on: a new strategy is covered by adding its name here.
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass

from hypothesis import HealthCheck, settings
from hypothesis.internal.conjecture import junkdrawer

ENV = "AUTOTM_HYPOTHESIS"

# strategy -> devices (GPU static is all-fast or infeasible: tests/test_planning.py covers it)
STRATEGIES: dict[str, tuple[str, ...]] = {
    "static": ("cpu",),
    "sync": ("cuda", "cpu"),
    "async": ("cuda", "cpu"),
    "sync+recompute": ("cuda", "cpu"),
    "async+recompute": ("cuda", "cpu"),
    "recompute-only": ("cuda", "cpu"),
}
RECOMPUTE = ("sync+recompute", "async+recompute", "recompute-only")


@dataclass(frozen=True)
class Sizes:
    small_examples: int  # per strategy, problems of 3-8 kernels
    large_examples: int  # per (kind, strategy), problems of `large_kernels` kernels
    large_kernels: tuple[int, int]
    large_time_limit_s: float = 60.0  # per solve; a plan found by then is still checked


PROFILES: dict[str, Sizes] = {
    "dev": Sizes(15, 1, (100, 250)),
    "slow": Sizes(1000, 60, (100, 500)),
    "nightly": Sizes(5000, 300, (100, 500)),
}


def active() -> str:
    name = os.environ.get(ENV, "dev") or "dev"
    if name not in PROFILES:
        raise ValueError(f"{ENV}={name!r}: choose one of {', '.join(PROFILES)}")
    return name


def register_and_load() -> None:
    """Register every profile with hypothesis and load the active one."""
    for name, sizes in PROFILES.items():
        settings.register_profile(
            name, max_examples=sizes.small_examples, deadline=None, print_blob=True,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    settings.load_profile(active())
    keep_ctrl_c()


def keep_ctrl_c() -> None:
    """Remove hypothesis's gc-timing callback (a KeyboardInterrupt raised in a gc callback is
    lost); hypothesis installs it once, on the first call, which this makes now."""
    junkdrawer.gc_cumulative_time()
    gc.callbacks[:] = [cb for cb in gc.callbacks if not is_hypothesis_callback(cb)]


def is_hypothesis_callback(callback: object) -> bool:
    return str(getattr(callback, "__module__", "")).startswith("hypothesis.")


SIZES = PROFILES[active()]
