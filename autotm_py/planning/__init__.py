"""Planning: the placement ILP (gadgets, location paths, formulation), solvers, decoding into a
Plan, and the baselines. `solve.plan` is the entry point (see `solve.py`).

The public names are imported lazily (on first use), so `import autotm_py.planning` loads no
PuLP: `SOLVERS` (`solvers.py`) imports it when it is first used.
"""

from __future__ import annotations

from autotm_py.exports import lazy_exports

# public name -> module that defines it
_EXPORTS = {
    "BASELINES": "autotm_py.planning.baselines",
    "BaselineResult": "autotm_py.planning.baselines",
    "transfer_bound": "autotm_py.planning.bounds",
    "SolveControl": "autotm_py.planning.control",
    "Terminated": "autotm_py.planning.control",
    "handle_signals": "autotm_py.planning.control",
    "Smallest": "autotm_py.planning.feasibility",
    "PlanResult": "autotm_py.planning.solve",
    "SOLVERS": "autotm_py.planning.solvers",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals)
