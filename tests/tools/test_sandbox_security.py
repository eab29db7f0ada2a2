"""The adversarial suite: every attack must be contained -- the host survives, the call returns
within its timeout plus a small margin, the outcome is reported with a reason, and nothing the
code started is left running.

Each attack runs against the full sandbox (namespaces, when the kernel allows them) and, where
that mode is meant to stop it too, against the rlimits-only fallback (see docs/tools.md)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from relax_gym.tools import ExecResult, SandboxPool

from .sandbox_helpers import wait_until_gone

MARGIN_S = 3.0  # on the shared, loaded 2-core box; the kill itself takes milliseconds


@pytest.fixture(params=["namespaces", "rlimits"])
def any_pool(request: pytest.FixtureRequest) -> SandboxPool:
    return request.getfixturevalue("pool" if request.param == "namespaces" else "rlimits_pool")


def run_attack(pool: SandboxPool, code: str, timeout_s: float, **limits: object) -> ExecResult:
    start = time.monotonic()
    result = pool.run(code, timeout_s=timeout_s, **limits)
    elapsed = time.monotonic() - start
    assert elapsed < timeout_s + MARGIN_S, f"call took {elapsed:.1f} s for a {timeout_s} s timeout"
    assert wait_until_gone() == [], "processes of the call's uid survived it"
    assert pool.run("print('still serving')").stdout == "still serving\n"
    return result


def test_fork_bomb(any_pool: SandboxPool) -> None:
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    r = run_attack(any_pool, code, timeout_s=2.0, max_processes=16)
    assert r.timed_out and r.killed_reason == "timeout"


def test_shell_fork_bomb(pool: SandboxPool) -> None:
    r = run_attack(pool, "import os\nos.system(':(){ :|:& };:')\nimport time\ntime.sleep(60)", timeout_s=2.0, max_processes=16)
    assert r.killed_reason == "timeout"


def test_fork_bomb_that_gives_up_is_reported(pool: SandboxPool) -> None:
    r = run_attack(pool, "import os, time\nwhile True:\n    os.fork()\n    time.sleep(0.001)\n", timeout_s=3.0, max_processes=8)
    assert r.killed_reason in ("process_limit", "timeout")
    if r.killed_reason == "process_limit":
        assert "BlockingIOError" in r.stderr


def test_memory_bomb(any_pool: SandboxPool) -> None:
    code = "chunks = []\nwhile True:\n    chunks.append(bytearray(32 * 1024 * 1024))\n"
    r = run_attack(any_pool, code, timeout_s=10.0, memory_mb=256)
    assert r.killed_reason == "memory_limit" and r.exit_code == 1
    assert "MemoryError" in r.stderr


def test_single_huge_allocation(any_pool: SandboxPool) -> None:
    r = run_attack(any_pool, "x = b' ' * (8 * 1024 ** 3)", timeout_s=5.0, memory_mb=512)
    assert r.killed_reason == "memory_limit"


def test_infinite_loop(any_pool: SandboxPool) -> None:
    r = run_attack(any_pool, "while True:\n    pass\n", timeout_s=1.0)
    assert r.killed_reason in ("timeout", "cpu_time_limit") and r.exit_code is not None and r.exit_code < 0


def test_output_flood(any_pool: SandboxPool) -> None:
    r = run_attack(any_pool, "while True:\n    print('x' * 200)\n", timeout_s=10.0, max_output_bytes=4096, output_kill_bytes=2 * 1024 * 1024)
    assert r.killed_reason == "output_limit" and not r.timed_out
    assert len(r.stdout) < 4096 + 100 and r.stdout_truncated > 0


def test_output_flood_on_stderr_without_newlines(pool: SandboxPool) -> None:
    r = run_attack(pool, "import sys\nwhile True:\n    sys.stderr.write('e' * 4096)\n", timeout_s=10.0, output_kill_bytes=1024 * 1024)
    assert r.killed_reason == "output_limit" and len(r.stderr) < 70_000


def _write_attempts(targets: list[str]) -> str:
    return (
        "import json, os\n"
        "out = {}\n"
        f"for path in {targets!r}:\n"
        "    try:\n"
        "        with open(path, 'w') as fh:\n"
        "            fh.write('escaped')\n"
        "        out[path] = 'WROTE'\n"
        "    except OSError as exc:\n"
        "        out[path] = type(exc).__name__ + ': ' + (exc.strerror or '')\n"
        "try:\n"
        "    os.symlink('/etc/relax-escape-link', 'link')\n"
        "    open('link', 'w').write('x')\n"
        "    out['symlink'] = 'WROTE'\n"
        "except OSError as exc:\n"
        "    out['symlink'] = type(exc).__name__\n"
        "print(json.dumps(out))\n"
    )


def test_writing_outside_the_temp_dir(pool: SandboxPool) -> None:
    if not (pool.capabilities["filesystem"] or pool.capabilities["uid"]):
        pytest.skip("neither a mount namespace nor a per-call uid: the code writes as the host's user")
    tag = uuid.uuid4().hex[:8]
    here = os.path.dirname(os.path.abspath(__file__))
    targets = [
        f"{here}/escape-{tag}",
        f"/root/escape-{tag}",
        f"/etc/escape-{tag}",
        f"/usr/escape-{tag}",
        f"/var/tmp/escape-{tag}",
        f"/dev/shm/escape-{tag}",
        f"../escape-{tag}",
    ]
    r = run_attack(pool, _write_attempts(targets), timeout_s=5.0)
    outcome = json.loads(r.stdout)
    assert r.ok, r.stderr
    if pool.capabilities["filesystem"]:
        assert all(v != "WROTE" for v in outcome.values()), outcome
    else:  # without a mount namespace, only what the per-call uid may not write is protected
        assert all(outcome[t] != "WROTE" for t in targets[:4]), outcome
    for t in targets[:6]:
        assert not os.path.exists(t), f"{t} was created on the host"
    assert not os.path.exists(f"/tmp/escape-{tag}") and not os.path.exists(f"/escape-{tag}")


def test_writing_outside_the_temp_dir_rlimits_mode(rlimits_pool: SandboxPool) -> None:
    if not rlimits_pool.capabilities["uid"]:
        pytest.skip("without root there is no per-call uid: rlimits mode cannot protect the filesystem")
    tag = uuid.uuid4().hex[:8]
    here = os.path.dirname(os.path.abspath(__file__))
    targets = [f"{here}/escape-{tag}", f"/root/escape-{tag}", f"/etc/escape-{tag}", f"/usr/escape-{tag}"]
    r = run_attack(rlimits_pool, _write_attempts(targets), timeout_s=5.0)
    outcome = json.loads(r.stdout)
    assert all(outcome[t].startswith("PermissionError") for t in targets), outcome
    assert not any(os.path.exists(t) for t in targets)


def test_reading_another_calls_files(any_pool: SandboxPool) -> None:
    if not (any_pool.capabilities["filesystem"] or any_pool.capabilities["uid"]):
        pytest.skip("neither a mount namespace nor a per-call uid: calls share the user's files")
    secret = uuid.uuid4().hex
    writer = (
        "import os, time\n"
        f"open('secret.txt', 'w').write({secret!r})\n"
        "print(os.path.abspath('secret.txt'), flush=True)\n"
        "time.sleep(2.0)\n"
    )
    reader = (
        "import glob, os, time\n"
        "time.sleep(0.5)\n"
        "found = []\n"
        "candidates = glob.glob('/tmp/**/secret.txt', recursive=True) + glob.glob('/tmp/*/secret.txt')\n"
        "for pid in os.listdir('/proc'):\n"
        "    if pid.isdigit():\n"
        "        candidates.append(f'/proc/{pid}/cwd/secret.txt')\n"
        "for path in candidates:\n"
        "    try:\n"
        "        found.append(open(path).read())\n"
        "    except OSError:\n"
        "        pass\n"
        "print(found)\n"
    )
    results: dict[str, ExecResult] = {}
    t = threading.Thread(target=lambda: results.setdefault("writer", any_pool.run(writer, timeout_s=10)))
    t.start()
    results["reader"] = run_attack(any_pool, reader, timeout_s=10)
    t.join(20)
    assert secret not in results["reader"].stdout
    assert results["writer"].ok
    # and afterwards: the writer's file is gone, for a later call as for the host
    path = results["writer"].stdout.strip()
    later = run_attack(any_pool, f"print(open({path!r}).read())", timeout_s=5)
    assert secret not in later.stdout and later.exit_code == 1
    assert not os.path.exists(path)


@pytest.fixture
def tcp_server() -> Iterator[tuple[int, list[bytes]]]:
    """A TCP server on 127.0.0.1 that records what it receives; stopped after the test."""
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    srv.settimeout(0.2)
    received: list[bytes] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except (TimeoutError, OSError):
                continue
            with conn:
                conn.settimeout(1.0)
                try:
                    received.append(conn.recv(1024) or b"<connected>")
                except OSError:
                    received.append(b"<connected>")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield srv.getsockname()[1], received
    stop.set()
    thread.join(5)
    srv.close()


def test_socket_to_a_local_server(pool: SandboxPool, tcp_server: tuple[int, list[bytes]]) -> None:
    port, received = tcp_server
    code = (
        "import socket\n"
        "try:\n"
        f"    s = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
        "    s.sendall(b'leak')\n"
        "    print('connected')\n"
        "except OSError as exc:\n"
        "    print('blocked:', exc)\n"
    )
    r = run_attack(pool, code, timeout_s=5.0)
    if not pool.capabilities["network"]:
        pytest.skip("no network namespace on this kernel: network isolation is not available")
    assert r.stdout.startswith("blocked:"), r.stdout
    time.sleep(0.3)
    assert received == []


def test_sleeping_past_the_timeout(any_pool: SandboxPool) -> None:
    r = run_attack(any_pool, "import time\ntime.sleep(60)\n", timeout_s=1.0)
    assert r.timed_out and r.killed_reason == "timeout" and 0.9 < r.duration_s < 1.0 + MARGIN_S


def test_killing_the_parent_and_the_host(any_pool: SandboxPool) -> None:
    if not (any_pool.capabilities["pid"] or any_pool.capabilities["uid"]):
        pytest.skip("neither a PID namespace nor a per-call uid: the code may signal the host's user")
    assert any_pool._proc is not None
    zygote = any_pool._proc.pid
    code = (
        "import os, signal\n"
        f"for name, pid in [('parent', os.getppid()), ('host', {os.getpid()}), ('zygote', {zygote})]:\n"
        "    try:\n"
        "        os.kill(pid, signal.SIGKILL)\n"
        "        print(name, 'signalled')\n"
        "    except OSError as exc:\n"
        "        print(name, type(exc).__name__)\n"
        "print('alive')\n"
    )
    r = run_attack(any_pool, code, timeout_s=5.0)
    assert any_pool._proc.poll() is None, "the zygote was killed"
    assert "alive" in r.stdout or r.killed_reason is not None
    # kill(-1): every process the code may signal
    r2 = run_attack(any_pool, "import os, signal\nos.kill(-1, signal.SIGKILL)\nprint('after')", timeout_s=5.0)
    assert r2.exit_code is not None and any_pool._proc.poll() is None


def test_background_children_do_not_survive(any_pool: SandboxPool) -> None:
    if not (any_pool.capabilities["pid"] or any_pool.capabilities["uid"]):
        pytest.skip("without a PID namespace or a per-call uid, a child that calls setsid() escapes")
    marker = f"relax-bg-{uuid.uuid4().hex[:8]}"
    code = (
        "import os, subprocess\n"
        f"subprocess.Popen(['/bin/sh', '-c', 'sleep 30', '{marker}'], start_new_session=True,\n"
        "                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        f"        os.execv('/bin/sh', ['/bin/sh', '-c', 'sleep 30', '{marker}-daemon'])\n"
        "    os._exit(0)\n"
        "print('spawned')\n"
    )
    r = run_attack(any_pool, code, timeout_s=5.0)
    assert r.stdout == "spawned\n"
    assert wait_until_gone(marker) == [], "a background process outlived the call"


def test_unix_socket_of_a_host_service_under_run(pool: SandboxPool) -> None:
    """Path-based Unix sockets ignore network namespaces; the sandbox's /run is empty."""
    if not (pool.capabilities["filesystem"] and os.path.isdir("/run") and not os.path.islink("/run")):
        pytest.skip("needs a mount namespace and a /run directory")
    path = f"/run/relax-test-{uuid.uuid4().hex[:8]}.sock"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    os.chmod(path, 0o777)  # a service socket anyone may connect to
    srv.listen(1)
    srv.settimeout(0.5)
    try:
        code = (
            "import socket, os\n"
            "s = socket.socket(socket.AF_UNIX)\n"
            "try:\n"
            f"    s.connect({path!r})\n"
            "    print('connected')\n"
            "except OSError as exc:\n"
            "    print('blocked:', exc, os.listdir('/run'))\n"
        )
        r = run_attack(pool, code, timeout_s=5.0)
        assert r.stdout.startswith("blocked:"), r.stdout
        with pytest.raises(socket.timeout):
            srv.accept()
    finally:
        srv.close()
        os.unlink(path)


def test_sysv_ipc_is_private(pool: SandboxPool) -> None:
    if not pool.capabilities["network"]:
        pytest.skip("no network/IPC namespace")
    r = run_attack(pool, "print(open('/proc/sysvipc/shm').read().count('\\n'))", timeout_s=5.0)
    assert r.stdout.strip() == "1"  # the header line only: no segment of the host is visible
