"""Engine lifecycle as attack surface: a weight-group peer that never comes, SIGTERM while calls
hang, and removing an engine from the router while a control call is in flight.

The engines are real ``relax-gym engine serve`` processes on 127.0.0.1 (a tiny Qwen3); the
router race runs against a small local HTTP server whose control route is slow on purpose.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from relax_gym.protocol import EngineClient, EngineClosed

pytest.importorskip("torch")
pytest.importorskip("transformers")

from relax_gym.trainer.engines.launch import EmbeddedEngineProcess, ServerProcess  # noqa: E402
from relax_gym.trainer.rollout.router import EngineRouter  # noqa: E402

API_KEY = "lifecycle-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
GROUP_TIMEOUT_S = 1.0  # the "quick" engine's --weight-group-timeout
SLACK_S = 4.0  # a loaded 2-core box


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from relax_gym.trainer.models import build_tiny_model

    return build_tiny_model("qwen3", tmp_path_factory.mktemp("models") / "tiny", tokenizer="tiny-bpe", seed=0)


@pytest.fixture(scope="module")
def engines(tiny_model: Path) -> Iterator[dict[str, EmbeddedEngineProcess]]:
    """``quick``: a 1 s weight-group timeout; ``patient``: the default (60 s), for SIGTERM.
    Both start at once (start-up dominates this module's time)."""
    out = {
        "quick": EmbeddedEngineProcess(tiny_model, api_key=API_KEY, threads=1,
                                       extra_args=["--weight-group-timeout", str(GROUP_TIMEOUT_S)]),
        "patient": EmbeddedEngineProcess(tiny_model, api_key=API_KEY, threads=1),
    }
    try:
        for engine in out.values():
            ServerProcess.start(engine)  # spawn both, then wait
        for engine in out.values():
            engine.wait_healthy(engine._read_port, timeout_s=240)
        yield out
    finally:
        for engine in out.values():
            engine.stop()


def init_body(port: int, group: str) -> dict[str, Any]:
    return {"master_address": "127.0.0.1", "master_port": port, "rank_offset": 1, "world_size": 2,
            "group_name": group, "backend": "gloo"}


def generate_ok(http: httpx.Client, url: str) -> None:
    resp = http.post(f"{url}/generate", json={"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 3}})
    assert resp.status_code == 200 and len(resp.json()["output_ids"]) == 3, resp.text


def timed_init(http: httpx.Client, url: str, body: dict[str, Any]) -> tuple[httpx.Response, float]:
    start = time.monotonic()
    resp = http.post(f"{url}/init_weights_update_group", json=body)
    return resp, time.monotonic() - start


def test_a_trainer_that_never_comes_costs_one_bounded_error(engines: dict[str, EmbeddedEngineProcess]) -> None:
    url = engines["quick"].url
    import torch.distributed as dist

    with httpx.Client(headers=AUTH, timeout=GROUP_TIMEOUT_S + 20) as http:
        # nobody listens at the master port
        resp, took = timed_init(http, url, init_body(free_port(), "nobody-listens"))
        assert resp.status_code == 504 and took < GROUP_TIMEOUT_S + SLACK_S, (resp.text, took)
        assert resp.json()["success"] is False and "nobody-listens" in resp.json()["message"]
        # a master listens (the store is up) but rank 0 never builds the group
        port = free_port()
        store = dist.TCPStore("127.0.0.1", port, 2, is_master=True, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=30))
        resp, took = timed_init(http, url, init_body(port, "nobody-joins"))
        del store
        assert resp.status_code == 504 and took < GROUP_TIMEOUT_S + SLACK_S, (resp.text, took)
        # many at once: each answers within the bound; joins beyond the cap are refused, not queued
        results: list[tuple[int, float]] = []

        def one(i: int) -> None:
            r, t = timed_init(http, url, init_body(free_port(), f"flood-{i}"))
            results.append((r.status_code, t))

        threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(GROUP_TIMEOUT_S + 30)
        assert len(results) == 8 and {code for code, _ in results} <= {503, 504}, results
        assert 503 in {code for code, _ in results} and max(t for _, t in results) < GROUP_TIMEOUT_S + SLACK_S
        # an update asking for more buffer than the model holds is refused before any allocation
        huge = http.post(f"{url}/update_weights_from_distributed",
                         json={"names": ["a"], "dtypes": ["float32"], "shapes": [[10**6, 10**6]]})
        assert huge.status_code == 400 and "bytes" in huge.text, huge.text
        generate_ok(http, url)  # still serving
        assert http.get(f"{url}/get_server_info").json()["weight_update_groups"] == []
        # the abandoned rendezvous threads wind down by themselves (bounded), freeing the join slots
        deadline = time.monotonic() + GROUP_TIMEOUT_S + 30
        while http.get(f"{url}/get_server_info").json()["pending_weight_group_joins"] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert http.get(f"{url}/get_server_info").json()["pending_weight_group_joins"] == 0


async def test_a_broadcast_that_never_comes_is_bounded_and_leaves_generation_running(
    engines: dict[str, EmbeddedEngineProcess],
) -> None:
    """Rank 0 (this process) opens the group with the engine, then never sends the tensors."""
    from relax_gym.trainer.config import DistributedSyncConfig
    from relax_gym.trainer.weights.broadcast import BroadcastTransport

    url = engines["quick"].url
    sender = BroadcastTransport(DistributedSyncConfig(master_port=free_port(), timeout_s=20), api_key=API_KEY)
    await sender.ensure_group([url])
    silent = sender.group_name
    try:
        async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=GROUP_TIMEOUT_S + 20) as http:
            assert silent in (await http.get("/get_server_info")).json()["weight_update_groups"]
            start = time.monotonic()
            update = asyncio.create_task(http.post(
                "/update_weights_from_distributed",
                json={"names": ["model.norm.weight"], "dtypes": ["float32"], "shapes": [[64]], "group_name": silent},
            ))
            await asyncio.sleep(0.2)
            gen = await http.post("/generate", json={"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 2}})
            assert gen.status_code == 200 and not update.done()  # the engine thread is not waiting on the network
            resp = await update
            took = time.monotonic() - start
            assert resp.status_code == 504 and took < GROUP_TIMEOUT_S + SLACK_S, (resp.text, took)
            assert resp.json()["success"] is False and "/init_weights_update_group" in resp.json()["message"]
            # the out-of-step group is gone; the weights were not touched
            assert (await http.get("/get_server_info")).json()["weight_update_groups"] == []
            assert (await http.get("/get_model_info")).json()["weight_version"] == "default"
    finally:
        await sender.close()


def test_sigterm_stops_the_engine_promptly_while_calls_hang(engines: dict[str, EmbeddedEngineProcess]) -> None:
    engine = engines["patient"]  # 60 s group timeout: the init below would hang for a minute
    assert engine.proc is not None and engine.port is not None
    url, port, pid = engine.url, engine.port, engine.proc.pid
    replies: list[object] = []

    def call(path: str, body: dict[str, Any]) -> None:
        try:
            replies.append(httpx.post(f"{url}{path}", json=body, headers=AUTH, timeout=60).status_code)
        except httpx.HTTPError as exc:
            replies.append(type(exc).__name__)

    calls = [
        threading.Thread(target=call, args=("/init_weights_update_group", init_body(free_port(), "hang"))),
        threading.Thread(target=call, args=("/generate", {"input_ids": [5, 6, 7], "sampling_params": {
            "max_new_tokens": 100_000, "ignore_eos": True}})),
    ]
    for t in calls:
        t.start()
    time.sleep(1.0)  # both are in flight
    start = time.monotonic()
    os.kill(pid, signal.SIGTERM)  # the server process only: nothing else helps it exit
    engine.proc.wait(timeout=15)
    took = time.monotonic() - start
    assert took < 10.0, took
    for t in calls:
        t.join(30)
    assert len(replies) == 2  # the calls ended too (cut off or refused), nothing hangs
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)  # no process of its group is left


# ------------------------------------------------------------------------------------------------
# router: removing an engine while a control call is in flight
# ------------------------------------------------------------------------------------------------
async def slow_engine(delay_s: float) -> tuple[Any, str, asyncio.Event]:
    """An engine stand-in on 127.0.0.1 whose /pause_generation takes ``delay_s`` (or until the
    server is cleaned up)."""
    from aiohttp import web

    entered = asyncio.Event()
    released = asyncio.Event()

    async def health(_: web.Request) -> web.Response:
        return web.Response(status=200)

    async def model_info(_: web.Request) -> web.Response:
        return web.json_response({"model_path": "m", "weight_version": None})

    async def pause(_: web.Request) -> web.Response:
        entered.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(released.wait(), delay_s)
        return web.json_response({"success": True})

    async def on_shutdown(_: web.Application) -> None:
        released.set()

    app = web.Application()
    app.on_shutdown.append(on_shutdown)
    app.add_routes([web.get("/health", health), web.get("/get_model_info", model_info),
                    web.post("/pause_generation", pause)])
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}", entered


@pytest.mark.parametrize("transport", ["httpx", "aiohttp"])
async def test_removal_waits_for_an_inflight_control_call_then_refuses_cleanly(transport: str) -> None:
    runner, url, entered = await slow_engine(delay_s=0.5)
    try:
        async with EngineRouter([url], health_interval_s=3600, close_grace_s=5.0,
                                client_factory=lambda u, n: EngineClient(u, transport=transport)) as router:
            handle = router.engines[0]
            pause = asyncio.create_task(handle.client.pause_generation("abort"))
            await entered.wait()
            start = time.monotonic()
            removals = [asyncio.create_task(router.remove_engine(handle.id, drain=False)) for _ in range(2)]
            await asyncio.sleep(0.05)
            assert handle.state == "removed" and router.live() == []  # nothing new is routed there
            await router.pause()  # a router-wide control call meanwhile skips it
            await router.resume()
            await asyncio.gather(*removals)  # a second removal joins the first
            assert time.monotonic() - start >= 0.3  # it waited for the call in flight
            assert await pause is None  # which completed normally, not cut off
            with pytest.raises(EngineClosed):  # a call racing the removal: a typed error
                await handle.client.model_info()
            assert not await handle.client.health()
            assert router.events["removed"] == 1 and router.events["marked_unhealthy"] == 0
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("transport", ["httpx", "aiohttp"])
async def test_a_call_outliving_the_grace_gets_engine_closed(transport: str) -> None:
    runner, url, entered = await slow_engine(delay_s=60.0)
    try:
        async with EngineRouter([url], health_interval_s=3600, close_grace_s=0.3,
                                client_factory=lambda u, n: EngineClient(u, transport=transport)) as router:
            handle = router.engines[0]
            pause = asyncio.create_task(handle.client.pause_generation("abort"))
            await entered.wait()
            await asyncio.wait_for(router.remove_engine(handle.id, drain=False), 5.0)
            with pytest.raises(EngineClosed):
                await asyncio.wait_for(pause, 5.0)
    finally:
        await runner.cleanup()


def test_sigterm_while_the_sglang_launcher_waits_for_health_stops_its_server(tmp_path: Path) -> None:
    """``relax-gym engine sglang`` starts the server in a session of its own; a SIGTERM that
    arrives before ``/health`` answers must still take the server down with the launcher."""
    import subprocess
    import sys

    fake = tmp_path / "fake"
    (fake / "sglang").mkdir(parents=True)
    (fake / "sglang" / "__init__.py").write_text("")
    (fake / "sglang" / "launch_server.py").write_text(  # never becomes healthy
        "import os, pathlib, time\n"
        "pathlib.Path(os.environ['FAKE_SGLANG_PID']).write_text(str(os.getpid()))\n"
        "time.sleep(600)\n"
    )
    pid_file = tmp_path / "server.pid"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake), os.environ.get("PYTHONPATH", "")]),
           "FAKE_SGLANG_PID": str(pid_file)}
    launcher = subprocess.Popen(
        [sys.executable, "-m", "relax_gym.cli.main", "engine", "sglang", "--model", "m", "--port", str(free_port()),
         "--timeout", "120", "--log-file", str(tmp_path / "sglang.log")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    server_pid = None
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() or not pid_file.read_text():
            assert launcher.poll() is None, launcher.communicate()
            assert time.monotonic() < deadline, "the fake server never started"
            time.sleep(0.1)
        server_pid = int(pid_file.read_text())
        start = time.monotonic()
        launcher.send_signal(signal.SIGTERM)
        launcher.wait(timeout=15)
        assert time.monotonic() - start < 10.0
        with pytest.raises(ProcessLookupError):
            os.kill(server_pid, 0)  # stopped (and reaped) by the launcher
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait(5)
        if server_pid is not None:
            try:
                os.killpg(server_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.slow  # one more engine start (~10-30 s on a busy 2-core box)
def test_an_engine_whose_parent_is_killed_stops_by_itself(tiny_model: Path, tmp_path: Path) -> None:
    """A trainer (or torchrun rank) killed with SIGKILL runs no clean-up: the engines it
    started notice their parent is gone and stop, so nothing is left running."""
    import subprocess
    import sys

    script = tmp_path / "parent.py"
    script.write_text(
        "import sys, time\n"
        "from relax_gym.trainer.engines.launch import EmbeddedEngineProcess\n"
        f"e = EmbeddedEngineProcess({str(tiny_model)!r}, threads=1, startup_timeout_s=240)\n"
        "e.start()\n"
        "print(e.proc.pid, flush=True)\n"
        "time.sleep(600)\n", encoding="utf-8")
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parents[2])
    engine_pid = 0
    try:
        assert parent.stdout is not None
        engine_pid = int(parent.stdout.readline().strip())
        assert Path(f"/proc/{engine_pid}").exists()
        parent.kill()  # no finally, no atexit: only the engine's own watch can stop it
        parent.wait(10)
        deadline = time.monotonic() + 30 + SLACK_S
        while time.monotonic() < deadline:
            stat = Path(f"/proc/{engine_pid}/stat")
            if not stat.exists() or stat.read_text().split()[2] == "Z":
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"engine {engine_pid} still runs after its parent was killed")
    finally:
        if parent.poll() is None:
            parent.kill()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if engine_pid and Path(f"/proc/{engine_pid}").exists():
                os.killpg(engine_pid, signal.SIGKILL)
