"""Runtime: simulate a plan (`simulate`, no torch) and execute it on a device (`execute`,
`executor`, `drivers`, `eager`, `device`: these import torch at their top).

The public names are imported lazily (on first use), so `import autotm_py.runtime` loads no
torch: `Simulator` needs none, the names of the executor import it when they are first used.
(`execute`, the function, is not re-exported: the name is also its module's.)
"""

from __future__ import annotations

from autotm_py.exports import lazy_exports

# public name -> module that defines it
_EXPORTS = {
    "use_replay_work_queues": "autotm_py.runtime.device",
    "PlacedTables": "autotm_py.runtime.embedding_bag",
    "give_back": "autotm_py.runtime.drivers",
    "fit_checkpointing": "autotm_py.runtime.eager",
    "measure_autograd": "autotm_py.runtime.eager",
    "RunResult": "autotm_py.runtime.execute",
    "install_placed": "autotm_py.runtime.execute",
    "new_executor": "autotm_py.runtime.execute",
    "KERNEL_RANGE": "autotm_py.runtime.executor",
    "Simulator": "autotm_py.runtime.simulate",
    "SimulationResult": "autotm_py.runtime.simulate_result",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals)
