"""A package's public names, imported from their submodules on first use (PEP 562).

Packages whose submodules import heavy libraries (torch, the HTTP stack) list their names here,
so that importing one light submodule -- a config section validated without torch -- does not
run the heavy ones through the package ``__init__``.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from typing import Any


def lazy_exports(package: str, homes: dict[str, list[str]]) -> tuple[Callable[[str], Any], list[str]]:
    """``(__getattr__, __all__)`` for ``package``, whose ``homes`` map a submodule's name to the
    names it provides: ``__getattr__, __all__ = lazy_exports(__name__, {...})``."""
    exports = {name: module for module, names in homes.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(import_module(f"{package}.{module}"), name)

    return __getattr__, sorted(exports)


__all__ = ["lazy_exports"]
