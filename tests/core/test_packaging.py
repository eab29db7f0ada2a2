"""pyproject.toml maps every top-level folder (and each sub-package) into relax_gym."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_folder_is_listed() -> None:
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(conf["packages"])
    mapping = conf["package-dir"]
    found = set()
    for pkg, folder in mapping.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            if any(part.startswith((".", "__")) for part in rel.parts):
                continue
            found.add(".".join([pkg, *rel.parts]))
    missing = sorted(found - listed)
    assert not missing, f"add these to [tool.setuptools] packages in pyproject.toml: {missing}"


def test_top_level_folders_map_under_relax_gym() -> None:
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    assert mapping == {
        "relax_gym": "relax_gym",
        "relax_gym.envs": "envs",
        "relax_gym.tools": "tools",
        "relax_gym.rewards": "rewards",
        "relax_gym.trainer": "trainer",
        "relax_gym.leaderboards": "leaderboards",
    }
