"""Lazy public names of a package (PEP 562): its `__getattr__` imports a name's module only when
the name is first used, so that importing a package (or any of its submodules, which runs the
package's `__init__`) imports nothing else: no torch, no PuLP, no import cycle.

    _EXPORTS = {"Trainer": "autotm_py.trainer.core"}     # public name -> defining module
    __all__ = sorted(_EXPORTS)
    __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str],
                 namespace: Callable[[], Mapping[str, Any]]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for `package`, whose public name `n` is defined in module
    `exports[n]`; `namespace` is the package's `globals`."""

    def getattr_(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    def dir_() -> list[str]:
        return sorted({*namespace(), *exports})

    return getattr_, dir_
