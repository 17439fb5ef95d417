"""Kernel costs: the profile cache, the torch profiler, the roofline estimate, calibration.

    costs = profile(graph, device="cpu")        # measure what the cache lacks (needs torch)
    costs = load_costs(graph, device="cuda")    # cache + shipped profiles, no measuring

See docs/profiling.md.
"""

from autotm_py.profiling.costs import KernelCosts
from autotm_py.profiling.profile import load_costs, profile

__all__ = ["KernelCosts", "load_costs", "profile"]
