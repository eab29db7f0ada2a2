from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from relax_gym.cli.main import main


def test_envs_lists_and_filters(capsys) -> None:
    assert main(["envs", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    sense = next(r for r in rows if r["id"] == "relax/SenseCount-v0")
    assert sense["modalities"] == ["text", "image", "audio", "video"] and sense["oracle"] is True
    assert main(["envs", "--modality", "video"]) == 0
    table = capsys.readouterr().out
    assert table.splitlines()[0].split()[:2] == ["ID", "MODALITIES"] and "relax/SenseCount-v0" in table


def test_check_exit_codes(capsys) -> None:
    assert main(["check", "relax/SenseCount-v0", "--seeds", "2"]) == 0
    assert "PASSED" in capsys.readouterr().out
    assert main(["check", "relax/NoSuchEnv-v0"]) == 2
    assert "no environment registered" in capsys.readouterr().err


def test_check_fails_with_exit_1_on_broken_env(capsys) -> None:
    import relax_gym

    relax_gym.register("cli/GlobalRandom-v0", "tests.core.envs_for_tests:GlobalRandomEnv")
    try:
        assert main(["check", "cli/GlobalRandom-v0", "--json"]) == 1
        report = json.loads(capsys.readouterr().out)
        assert report["passed"] is False
        assert any(c["name"] == "determinism" and not c["passed"] for c in report["checks"])
    finally:
        relax_gym.deregister("cli/GlobalRandom-v0")


def test_play_oracle_json_saves_media(tmp_path, capsys) -> None:
    media = tmp_path / "media"
    assert main(["play", "relax/SenseCount-v0", "--agent", "oracle", "--seed", "4", "--json", "--media-dir", str(media)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["success"] is True and out["turns"] == 1 and out["return"] == 1.0
    names = sorted(p.suffix for p in media.iterdir())
    assert names == [".json", ".mp4", ".png", ".wav"]
    transcript = json.loads((media / "transcript.json").read_text())
    assert transcript[0]["role"] == "user" and transcript[1]["role"] == "assistant"


def test_play_human_reads_stdin(tmp_path) -> None:
    """A real subprocess: the person types a multi-line answer (backslash continues the line)."""
    import relax_gym

    env = relax_gym.make("relax/SenseCount-v0")
    env.reset(seed=2)
    total = sum(env.unwrapped.counts)
    proc = subprocess.run(
        [sys.executable, "-m", "relax_gym.cli.main", "play", "relax/SenseCount-v0", "--seed", "2",
         "--media-dir", str(tmp_path)],
        input=f"my answer is\\\n\\boxed{{{total}}}\n", capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "success=True" in proc.stdout and "[image: image-" in proc.stdout


def test_no_command_prints_help(capsys) -> None:
    assert main([]) == 2
    assert "COMMAND" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["no-such-command"])
