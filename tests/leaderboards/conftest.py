"""Fixtures of the leaderboard tests: the lbtest envs and a baselines file for them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .envs_for_tests import BASELINES, register_all

register_all()


@pytest.fixture
def baselines_file(tmp_path: Path) -> Path:
    path = tmp_path / "baselines.json"
    path.write_text(json.dumps(BASELINES))
    return path
