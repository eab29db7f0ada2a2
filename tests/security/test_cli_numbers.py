"""Command-line numbers: non-finite or out-of-range values are refused by argparse with one
line naming the flag, instead of reaching a sampler or a timeout (a NaN temperature samples
garbage; an infinite timeout never fires)."""

from __future__ import annotations

import pytest

from relax_gym.cli.main import main

BAD_EVAL_FLAGS = [
    ("--temperature", "nan"),
    ("--temperature", "-1"),
    ("--temperature", "1e999"),
    ("--top-p", "inf"),
    ("--top-p", "1.5"),
    ("--min-p", "-0.1"),
    ("--timeout", "0"),
    ("--timeout", "-inf"),
    ("--episodes", "0"),
    ("--attempts", "-3"),
    ("--max-tokens", "0"),
    ("--concurrency", "0"),
    ("--max-turns", "x"),
]


@pytest.mark.parametrize(("flag", "value"), BAD_EVAL_FLAGS)
def test_eval_refuses_bad_numbers_naming_the_flag(flag: str, value: str, tmp_path, capsys) -> None:
    argv = ["eval", "--agent", "random", "--env", "relax/SenseCount-v0", "--out", str(tmp_path / "o"), flag, value]
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()  # nothing ran
