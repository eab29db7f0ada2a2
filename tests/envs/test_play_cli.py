"""`relax-gym play relax/<env> --agent oracle --json` reports success for every env: in-process
for all of them (fast), and once through a real subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from relax_gym.cli.main import main
from relax_gym.envs import SHIPPED


@pytest.mark.parametrize("env_id", [e.id for e in SHIPPED])
def test_play_oracle_succeeds_in_process(env_id: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["play", env_id, "--agent", "oracle", "--json", "--seed", "3", "--media-dir", str(tmp_path)]
    args += ["-k", "difficulty=hard"]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["success"] is True and summary["env_id"] == env_id
    assert summary["turns"] >= 1 and (tmp_path / "transcript.json").exists()


def test_play_oracle_image_render_of_a_game(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["play", "relax/Sokoban-v0", "--agent", "oracle", "--json", "-k", "render=image", "--media-dir", str(tmp_path)]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["success"] is True
    assert len(list(tmp_path.glob("image-*.png"))) >= summary["turns"]  # one board per turn (+ the first)


def test_play_oracle_in_a_real_subprocess(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "relax_gym.cli.main", "play", "relax/Mastermind-v0", "--agent", "oracle",
         "--json", "--seed", "11", "-k", "difficulty=medium", "--media-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["success"] is True and summary["turns"] > 1
