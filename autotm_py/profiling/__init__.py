"""Kernel costs: the profile cache, the torch profiler, the roofline estimate, calibration.

    from autotm_py.profiling.profile import profile, load_costs
    costs = profile(graph, device="cpu")        # measure what the cache lacks (needs torch)
    costs = load_costs(graph, device="cuda")    # cache + shipped profiles, no measuring

The public names are imported lazily (on first use), so importing the package loads no torch.
(`profile` and `calibrate`, the functions, are not re-exported: the names are also their
modules'.) See docs/profiling.md.
"""

from __future__ import annotations

from autotm_py.costs import KernelCosts
from autotm_py.exports import lazy_exports

# public name -> module that defines it
_EXPORTS = {
    "shipped_profiles_dir": "autotm_py.profiling.cache",
    "user_profiles_dir": "autotm_py.profiling.cache",
    "MiB": "autotm_py.profiling.calibrate",
    "Fingerprint": "autotm_py.profiling.fingerprint",
    "profile_in_context": "autotm_py.profiling.in_context",
    "load_costs": "autotm_py.profiling.profile",
    "held_logs": "autotm_py.profiling.profile",
}

__all__ = ["KernelCosts", *sorted(_EXPORTS)]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals)
