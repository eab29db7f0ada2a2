"""Importing the tools package is light and starts nothing."""

from __future__ import annotations

import subprocess
import sys


def test_import_is_light_and_starts_no_sandbox() -> None:
    code = (
        "import sys, relax_gym.tools as t\n"
        "heavy = [m for m in ('torch', 'transformers', 'ray', 'megatron', 'sglang') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "from relax_gym.tools.sandbox import pool\n"
        "assert pool._default is None, 'the default sandbox pool started at import'\n"
        "print(len(t.builtin_tools()))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "8"
