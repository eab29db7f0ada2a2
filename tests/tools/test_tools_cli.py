"""`relax-gym tools ...` through the real entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from relax_gym.cli.main import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["tools", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_list(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "list")
    assert code == 0
    assert "calculator(expression: string)" in out and "zoom(image_id: string, bbox: integer[4], factor?: number)" in out
    code, out, _ = run(capsys, "list", "--json")
    schemas = json.loads(out)
    assert code == 0 and {s["function"]["name"] for s in schemas} >= {"calculator", "python", "search", "zoom"}


def test_run_calculator_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "run", "calculator", "--args", '{"expression": "2+3"}')[:2] == (0, "5\n")
    code, out, _ = run(capsys, "run", "calculator", "--args", '{"expression": "1/0"}')
    assert code == 1 and out == "division by zero\n"
    code, _, err = run(capsys, "run", "calculator", "--args", "{nope")
    assert code == 2 and "--args is not valid JSON" in err
    code, _, err = run(capsys, "run", "calculater", "--args", "{}")
    assert code == 2 and "Did you mean 'calculator'" in err


def test_run_python(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "run", "python", "--code", "import sys; print(2 ** 10); print('e', file=sys.stderr)")
    assert code == 0 and out == "1024\n" and err.startswith("e\n[exit code 0")
    code, out, _ = run(capsys, "run", "python", "--code", "raise SystemExit(4)", "--json")
    assert code == 1 and json.loads(out)["exit_code"] == 4
    code, _, err = run(capsys, "run", "python", "--code", "while True: pass", "--timeout", "0.5")
    assert code == 1 and "stopped: timeout" in err


def test_run_zoom_writes_the_image(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    src = tmp_path / "in.png"
    Image.new("RGB", (50, 40), "green").save(src)
    out_dir = tmp_path / "out"
    code, out, _ = run(capsys, "run", "zoom", "--image", f"pic={src}", "--out-dir", str(out_dir),
                       "--args", '{"image_id": "pic", "bbox": [0, 0, 10, 10], "factor": 3}', "--json")
    assert code == 0
    (record,) = json.loads(out)["content"]
    written = Image.open(record["path"])
    assert record["type"] == "image" and written.size == (30, 30) and Path(record["path"]).parent == out_dir


def test_run_search_with_docs(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    docs = tmp_path / "docs.jsonl"
    docs.write_text('{"id": "x", "title": "T", "text": "red apples"}\n{"id": "y", "text": "green pears"}\n')
    code, out, _ = run(capsys, "run", "search", "--docs", str(docs), "--args", '{"query": "pears"}')
    assert code == 0 and json.loads(out)[0]["id"] == "y"


def test_parse_and_sandbox(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "parse", '<tool_call>{"name": "calculator", "arguments": {"expression": "1"}}</tool_call>')
    assert code == 0 and json.loads(out)["tool_calls"][0]["id"] == "call_0_0"
    code, out, _ = run(capsys, "parse", "--parser", "qwen3_coder", "<tool_call><function=x></tool_call>")
    assert code == 1 and "unclosed <function=x>" in json.loads(out)["parse_errors"][0]
    code, out, _ = run(capsys, "sandbox")
    assert code == 0 and "rlimits" in out


def test_no_action_prints_usage(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys)
    assert code == 2 and "usage" in err
