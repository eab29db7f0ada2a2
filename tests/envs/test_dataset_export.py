"""`relax-gym envs export` writes a shipped env's tasks as Parquet; the dataset env reads them
back with the same observations (media included) and the same oracle success."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("datasets", reason="export needs the `datasets` package (relax-gym[data], in dev)")

import relax_gym  # noqa: E402
from relax_gym.cli.main import main  # noqa: E402
from relax_gym.envs.export import ExportError, export_env  # noqa: E402
from relax_gym.types import AudioPart, ImagePart, VideoPart  # noqa: E402


def _oracle_success(env: relax_gym.Env, seeds: list[int]) -> list[bool]:
    out = []
    for s in seeds:
        env.reset(seed=s)
        out.append(bool(env.step(next(iter(env.oracle())))[4]["success"]))
    return out


@pytest.mark.parametrize(("env_id", "kwargs"), [
    ("relax/SceneQuery-v0", {"difficulty": "single"}),
    ("relax/ArithmeticWord-v0", {"difficulty": "hard"}),
    ("relax/ClockReading-v0", {}),
    ("relax/DTMFDecode-v0", {}),
    ("relax/SenseCount-v0", {}),
])
def test_round_trip_keeps_observations_and_oracle_success(tmp_path: Path, env_id: str, kwargs: dict) -> None:
    n = 4
    out = tmp_path / "tasks.parquet"
    result = export_env(env_id, n, out, seed=100, kwargs=kwargs)
    assert result["rows"] == n and result["oracle_success"] == 1.0 and Path(result["config"]).is_file()
    live = relax_gym.make(env_id, **kwargs)
    back = relax_gym.make("relax/Dataset-v0", config=result["config"], shuffle=False)
    for i in range(n):
        a, _ = live.reset(seed=100 + i)
        b, _ = back.reset(seed=i)
        assert b.text == a.text
        pixels = [(p.image.size, p.image.tobytes()) for p in a.parts(ImagePart)]
        assert [(p.image.size, p.image.tobytes()) for p in b.parts(ImagePart)] == pixels  # PNG is lossless
        for pa, pb in zip(a.parts(AudioPart), b.parts(AudioPart), strict=True):
            assert pb.sample_rate == pa.sample_rate
            assert np.abs(pb.waveform - pa.waveform).max() < 1e-3  # 16-bit WAV
        for va, vb in zip(a.parts(VideoPart), b.parts(VideoPart), strict=True):
            assert vb.frames.shape == va.frames.shape  # mp4 is lossy: same frames, close pixels
            assert np.abs(vb.frames.astype(int) - va.frames.astype(int)).mean() < 8
    assert _oracle_success(back, list(range(n))) == _oracle_success(live, [100 + i for i in range(n)])
    # a wrong answer fails in both
    live.reset(seed=100)
    back.reset(seed=0)
    assert not live.step("\\boxed{certainly wrong}")[4]["success"]
    assert not back.step("\\boxed{certainly wrong}")[4]["success"]


def test_export_cli_and_refusals(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "a.parquet"
    assert main(["envs", "export", "relax/ArithmeticWord-v0", "--episodes", "3", "--out", str(out)]) == 0
    assert "wrote 3 rows" in capsys.readouterr().out
    assert main(["envs", "export", "relax/Mastermind-v0", "--episodes", "3", "--out", str(tmp_path / "m.parquet")]) == 2
    assert "only one-turn envs" in capsys.readouterr().err
    with pytest.raises(ExportError, match=r"\.parquet"):
        export_env("relax/ArithmeticWord-v0", 2, tmp_path / "a.csv")
    assert main(["envs"]) == 0  # the listing still works beside the subcommand
