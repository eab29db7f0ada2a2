"""Finding the real ``sglang`` package for the compatibility tests, without running its heavy
``__init__`` (10-20 s, pulls transformers and CUDA checks).

Two installs are recognised, both optional:

* the wire-contract install, ``pip install --no-deps --target DIR sglang==0.5.23 msgspec`` (plus
  orjson, pybase64, pyzmq and triton for ``sglang.srt.utils.common``), used in this interpreter;
  ``RELAX_GYM_SGLANG_PATH=DIR`` names the folder when it is not on ``sys.path`` already;
* the full install (its own venv: it pins torch 2.14.1 and transformers 5.19), used through a
  subprocess for SGLang's pydantic request classes; ``RELAX_GYM_SGLANG_PYTHON`` names its python.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

_PATH_ENV = "RELAX_GYM_SGLANG_PATH"
_PYTHON_ENV = "RELAX_GYM_SGLANG_PYTHON"


def sglang_dir() -> Path | None:
    """The ``sglang`` package folder, or None (``find_spec``: the package's ``__init__`` never runs)."""
    loaded = sys.modules.get("sglang")
    if loaded is not None and getattr(loaded, "__path__", None):  # the bare package (no __spec__)
        return Path(next(iter(loaded.__path__)))
    extra = os.environ.get(_PATH_ENV)
    if extra and extra not in sys.path:
        sys.path.append(extra)  # appended: the project's own packages win over the target's copies
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def skip_reason() -> str | None:
    """Why the real-SGLang tests cannot run here, or None."""
    where = sglang_dir()
    if where is None:
        return (f"sglang is not installed: pip install --no-deps --target DIR sglang==0.5.23 msgspec and set "
                f"{_PATH_ENV}=DIR (see docs/engine.md, 'Checking against real SGLang')")
    if not (where / "api" / "v1" / "api_types.py").exists():
        return f"sglang at {where} has no api/v1/api_types.py (0.5.23 or newer is needed)"
    if importlib.util.find_spec("msgspec") is None:
        return "msgspec is missing (SGLang's wire contract is msgspec)"
    return None


def bare_package() -> None:
    """Put a bare ``sglang`` package in ``sys.modules`` so submodules import without its ``__init__``."""
    if "sglang" in sys.modules:
        return
    where = sglang_dir()
    assert where is not None
    pkg = types.ModuleType("sglang")
    pkg.__path__ = [str(where)]
    sys.modules["sglang"] = pkg


def api_types() -> Any:
    """SGLang's generated wire contract (pure msgspec), loaded by file path."""
    name = "_sglang_api_types"
    if name in sys.modules:
        return sys.modules[name]
    where = sglang_dir()
    assert where is not None
    spec = importlib.util.spec_from_file_location(name, where / "api" / "v1" / "api_types.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def submodule(name: str) -> Any | None:
    """``sglang.<name>`` through the bare package, or None when one of its imports is missing."""
    bare_package()
    try:
        return importlib.import_module(f"sglang.{name}")
    except ImportError:
        return None


def full_python() -> str | None:
    """The python of a full SGLang install (``RELAX_GYM_SGLANG_PYTHON``), or None."""
    python = os.environ.get(_PYTHON_ENV)
    if not python or not Path(python).exists():
        return None
    probe = subprocess.run([python, "-c", "import importlib.util as u; print(u.find_spec('sglang') is not None)"],
                           capture_output=True, text=True, timeout=60)
    return python if probe.stdout.strip() == "True" else None


__all__ = ["api_types", "bare_package", "full_python", "sglang_dir", "skip_reason", "submodule"]
