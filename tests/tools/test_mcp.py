"""MCP tool servers: a real server written with the official SDK (tests/tools/mcp_server.py),
started over stdio (and streamable HTTP on loopback), used by envs through ``mcp_servers``; and
our own tools served with ``relax-gym tools serve-mcp``."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("mcp", reason="MCP tools need the `mcp` SDK (relax-gym[mcp], in dev)")

import relax_gym  # noqa: E402
from relax_gym.tools.mcp import MCPServerError, mcp_tools, parse_servers, stats, wait_for_port  # noqa: E402
from relax_gym.types import ImagePart  # noqa: E402

SERVER = str(Path(__file__).with_name("mcp_server.py"))
# one config: every test reuses the process's one connection (a start costs seconds)
STDIO = {"name": "test-stdio", "command": [sys.executable, SERVER], "timeout_s": 4.0}


def call(name: str, **arguments: object) -> str:
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


@pytest.fixture()
def math_rows(tmp_path: Path) -> Path:
    pytest.importorskip("datasets")
    f = tmp_path / "sums.jsonl"
    f.write_text("".join(json.dumps({"q": f"What is {a} + {b}? Use the add tool.", "answer": str(a + b)}) + "\n"
                         for a, b in [(17, 25), (301, 99), (5, 8)]), encoding="utf-8")
    return f


def test_stdio_server_tools_in_a_dataset_env_with_oracle_and_scripted_model(math_rows: Path) -> None:
    env = relax_gym.make("relax/Dataset-v0", path=str(math_rows), prompt="q", reward="math_equiv",
                         shuffle=False, mcp_servers=[STDIO])
    obs, _ = env.reset(seed=0)
    names = [t.name for t in obs.tools]
    assert {"add", "swatch", "crash", "hang"} <= set(names)
    add = next(t for t in obs.tools if t.name == "add")
    assert add.parameters["required"] == ["a", "b"] and add.description == "Add two integers."
    # the chat template / OpenAI renderings see the MCP tools like our own
    assert any(spec["function"]["name"] == "add" for spec in [t.to_openai() for t in obs.tools])
    # scripted model: call the tool, read the result, answer
    obs, reward, term, _, info = env.step(call("add", a=17, b=25))
    assert not term and obs.messages[0].role == "tool" and "42" in obs.text
    _, reward, term, _, info = env.step("\\boxed{42}")
    assert term and info["success"] and reward == 1.0
    assert info["tools"]["per_tool"]["add"] == {"calls": 1, "errors": 0}
    # the oracle answers directly
    env.reset(seed=1)
    assert env.step(next(iter(env.oracle())))[4]["success"]
    # an image result becomes an image observation, rendered like any other
    env.reset(seed=2)
    obs, *_ = env.step(call("swatch", color="blue"))
    images = obs.parts(ImagePart)
    assert len(images) == 1 and images[0].image.getpixel((3, 3)) == (0, 0, 255)
    rendered = env.format_observation(obs, "openai")
    assert any(p.get("type") == "image_url" for m in rendered for p in (m["content"] if isinstance(m["content"], list) else []))
    # bad arguments are checked against the server's schema before the call
    obs, *_ = env.step(call("add", a="seven"))
    assert obs.text.startswith("Error:") and "add" in obs.text
    # the training step metrics carry the server's own counters
    from relax_gym.trainer.rollout.tool_metrics import mcp_metrics

    assert mcp_metrics()["tools/mcp/test-stdio/calls"] >= 2


def test_any_env_takes_mcp_servers() -> None:
    env = relax_gym.make("relax/ArithmeticWord-v0", mcp_servers=[STDIO])
    obs, _ = env.reset(seed=0)
    assert "add" in [t.name for t in obs.tools] and env.max_turns > 1
    assert env.step(next(iter(env.oracle())))[4]["success"]


@pytest.mark.slow
def test_a_tool_env_gets_the_servers_tools_beside_its_own() -> None:
    tool_env = relax_gym.make("relax/CalcArithmetic-v0", mcp_servers=[{**STDIO, "tools": ["add"], "prefix": "mcp_"}])
    names = [t.name for t in tool_env.reset(seed=0)[0].tools]
    assert "calculator" in names and "mcp_add" in names and "mcp_crash" not in names


@pytest.mark.slow  # three server restarts: ~30 s on a loaded 2-core box
def test_crash_hang_and_garbage_become_tool_errors_and_the_server_restarts() -> None:
    env = relax_gym.make("relax/ArithmeticWord-v0", mcp_servers=[STDIO])
    env.reset(seed=0)
    before = stats()["test-stdio"]
    pid1 = env.step(call("pid")).__getitem__(0).text.strip()
    for name, args in (("crash", {}), ("garbage", {}), ("hang", {"seconds": 60})):
        start = time.monotonic()
        obs, reward, term, trunc, info = env.step(call(name, **args))
        assert not term and not trunc and obs.text.startswith("Error:"), obs.text
        assert "restarted" in obs.text and time.monotonic() - start < 15
        assert info["tools"]["per_tool"][name]["errors"] == 1
    pid2 = env.step(call("pid"))[0].text.strip()
    assert pid1.isdigit() and pid2.isdigit() and pid1 != pid2
    after = stats()["test-stdio"]
    assert after["restarts"] - before["restarts"] >= 3 and after["timeouts"] - before["timeouts"] >= 1
    from relax_gym.trainer.rollout.tool_metrics import mcp_metrics

    assert mcp_metrics()["tools/mcp/test-stdio/restarts"] == after["restarts"]
    assert after["errors"] - before["errors"] >= 3


def test_a_server_that_does_not_start_names_the_command_and_its_stderr() -> None:
    with pytest.raises(MCPServerError, match=r"(?s)mcp_server.py --fail-start.*did not start.*cannot open the database"):
        mcp_tools([{"command": [sys.executable, SERVER, "--fail-start"], "startup_timeout_s": 60}])
    with pytest.raises(MCPServerError, match="command .*or url"):
        parse_servers([{"name": "x"}])


@pytest.mark.slow
def test_more_start_failures() -> None:
    with pytest.raises(MCPServerError, match=r"/nonexistent/mcp-server.*did not start"):
        mcp_tools([{"command": ["/nonexistent/mcp-server"], "startup_timeout_s": 30}])
    with pytest.raises(MCPServerError, match="has no tools"):
        mcp_tools([{**STDIO, "tools": ["nope"]}])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_streamable_http_server_on_loopback() -> None:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, SERVER, "--http", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        wait_for_port("127.0.0.1", port, 60)
        tools = {t.name: t for t in mcp_tools([{"url": f"http://127.0.0.1:{port}/mcp", "timeout_s": 10}])}
        assert tools["add"].invoke({"a": 2, "b": 40}).text == "42"
        assert tools["swatch"].invoke({"color": "red"}).content[0].image.getpixel((0, 0)) == (255, 0, 0)
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.slow
def test_serve_mcp_exposes_our_sandboxed_tools() -> None:
    cmd = [sys.executable, "-m", "relax_gym.cli.main", "tools", "serve-mcp"]
    tools = {t.name: t for t in mcp_tools([{"name": "ours", "command": cmd, "timeout_s": 60}])}
    assert set(tools) == {"calculator", "python"}
    assert tools["calculator"].invoke({"expression": "2**10 + 1"}).text == "1025"
    assert tools["python"].invoke({"code": "print(sum(range(10)))"}).text.strip() == "45"
    result = tools["calculator"].invoke({"expression": "1/0"})
    assert result.is_error and "division by zero" in result.text
