"""`import relax_gym` and making every shipped env must not import heavy frameworks."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

HEAVY = ("torch", "transformers", "ray", "megatron", "sglang")


def _has_datasets() -> bool:
    return importlib.util.find_spec("datasets") is not None


def test_import_and_make_every_env_stays_light() -> None:
    """Every registered env; relax/Dataset-v0 (the one that needs a path) on the shipped example
    file, the `datasets` reader included, when `datasets` is installed."""
    dataset = {"path": str(ROOT / "examples/data/math.jsonl"), "prompt": "problem"} if _has_datasets() else None
    code = (
        "import sys, relax_gym\n"
        f"DATASET = {dataset!r}\n"
        "for s in relax_gym.list_envs():\n"
        "    if s.id == 'relax/Dataset-v0' and DATASET is None:\n"
        "        continue\n"
        "    kw = DATASET if s.id == 'relax/Dataset-v0' else {}\n"
        "    env = relax_gym.make(s.id, **kw); env.reset(seed=0); env.close()\n"
        f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "print(len(relax_gym.list_envs()), heavy)\n"
        "assert not heavy, heavy\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    n_envs = int(proc.stdout.split()[0])
    assert n_envs >= 1


def test_cli_listing_stays_light() -> None:
    code = (
        "import sys, io, contextlib\n"
        "from relax_gym.cli.main import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['envs'])\n"
        f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
