"""Kernel costs: the profile cache, the torch profiler, the roofline estimate, calibration.

    from autotm_py.profiling.profile import profile, load_costs
    costs = profile(graph, device="cpu")        # measure what the cache lacks (needs torch)
    costs = load_costs(graph, device="cuda")    # cache + shipped profiles, no measuring

(The functions are not re-exported here: the name `profile` is also the module's.)
See docs/profiling.md.
"""

from autotm_py.costs import KernelCosts

__all__ = ["KernelCosts"]
