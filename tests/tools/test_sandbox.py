"""The sandbox's normal behaviour: output, exit codes, limits, working directory, environment,
sessions, concurrency and recovery. The attacks are in test_sandbox_security.py."""

from __future__ import annotations

import os
import threading
import time

import pytest
from relax_gym.tools import ExecResult, SandboxLimits, SandboxPool, run_python

from .sandbox_helpers import wait_until_gone


def test_stdout_stderr_and_success(pool: SandboxPool) -> None:
    r = pool.run("import sys\nprint('hello')\nprint('warn', file=sys.stderr)")
    assert (r.stdout, r.stderr, r.exit_code, r.timed_out, r.killed_reason) == ("hello\n", "warn\n", 0, False, None)
    assert r.ok and 0 < r.duration_s < 5
    assert r.summary() == "hello\nstderr:\nwarn"


def test_exit_codes_exceptions_and_syntax_errors(pool: SandboxPool) -> None:
    assert pool.run("import sys; sys.exit(3)").exit_code == 3
    assert pool.run("raise SystemExit('bye')").exit_code == 1
    assert pool.run("import os; os._exit(5)").exit_code == 5
    err = pool.run("def f():\n    return 1 / 0\nf()")
    assert err.exit_code == 1 and err.killed_reason is None
    assert err.stderr.startswith("Traceback (most recent call last):\n  File \"<sandbox>\", line 3")
    assert err.stderr.rstrip().endswith("ZeroDivisionError: division by zero")
    syn = pool.run("print(")
    assert syn.exit_code == 1 and "SyntaxError" in syn.stderr
    assert "[exit code 1]" in syn.summary()


def test_module_level_run_python_uses_the_default_pool() -> None:
    r = run_python("print(sum(range(10)))", timeout_s=5, memory_mb=512)
    assert isinstance(r, ExecResult) and r.stdout == "45\n" and r.ok


def test_timeout_is_a_hard_wall_clock_kill(pool: SandboxPool) -> None:
    start = time.monotonic()
    r = pool.run("print('started', flush=True)\nimport time\ntime.sleep(30)", timeout_s=0.5)
    assert time.monotonic() - start < 3.5
    assert r.timed_out and r.killed_reason == "timeout" and r.exit_code == -9
    assert r.stdout == "started\n"  # output before the kill is kept
    assert "[timed out" in r.summary()


def test_output_is_capped_head_and_tail(pool: SandboxPool) -> None:
    r = pool.run("print('A' * 5000)\nprint('B' * 5000)\nraise ValueError('the end')", max_output_bytes=1000)
    assert r.stdout.startswith("A" * 500) and r.stdout.rstrip().endswith("B" * 400)
    assert r.stdout_truncated == 10002 - 1000
    assert "bytes truncated" in r.stdout and len(r.stdout) < 1100
    assert r.stderr.rstrip().endswith("ValueError: the end")


def test_minimal_environment_and_fresh_working_directory(pool: SandboxPool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELAX_SECRET_TOKEN", "s3cret")
    code = (
        "import os, json\n"
        "open('out.txt', 'w').write('data')\n"
        "print(json.dumps({'env': dict(os.environ), 'cwd': os.getcwd(), 'files': os.listdir('.'), 'uid': os.getuid()}))"
    )
    import json

    first = json.loads(pool.run(code).stdout)
    second = json.loads(pool.run(code).stdout)
    assert "RELAX_SECRET_TOKEN" not in first["env"]
    assert set(first["env"]) <= {
        "PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "PYTHONIOENCODING", "PYTHONDONTWRITEBYTECODE",
        "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
    }  # fmt: skip
    assert first["files"] == ["out.txt"] and second["files"] == ["out.txt"]  # nothing carried over
    assert first["env"]["HOME"] == first["cwd"]
    if pool.capabilities["uid"]:
        assert first["uid"] != os.getuid() and first["uid"] != second["uid"]
    # the working directory is gone from the host once the call returned
    assert not os.path.exists(os.path.join(first["cwd"], "out.txt")) or pool.capabilities["filesystem"]


def test_rlimit_file_size(pool: SandboxPool) -> None:
    r = pool.run("open('big', 'wb').write(b'x' * (3 * 1024 * 1024))", max_file_mb=1)
    assert r.exit_code == 1 and r.killed_reason == "file_size_limit"
    assert "File too large" in r.stderr


def test_rlimit_open_files(pool: SandboxPool) -> None:
    r = pool.run("fs = [open('f%d' % i, 'w') for i in range(100)]", max_open_files=32)
    assert r.killed_reason == "open_files_limit" and "Too many open files" in r.stderr


def test_rlimit_cpu_time(pool: SandboxPool) -> None:
    r = pool.run("while True: pass", timeout_s=10, cpu_s=1)
    assert r.killed_reason == "cpu_time_limit" and r.exit_code == -24  # SIGXCPU
    assert 0.5 < r.duration_s < 5


def test_limits_are_validated() -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        SandboxLimits(timeout_s=0)
    with pytest.raises(ValueError, match="max_open_files"):
        SandboxLimits(max_open_files=4)
    assert SandboxLimits(timeout_s=2.5).to_wire()["cpu_s"] == 4


def test_concurrent_calls(pool: SandboxPool) -> None:
    results: list[ExecResult] = []
    lock = threading.Lock()

    def work(i: int) -> None:
        r = pool.run(f"import time; time.sleep(0.2); print({i})")
        with lock:
            results.append(r)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(r.stdout for r in results) == [f"{i}\n" for i in range(4)]
    assert time.monotonic() - start < 0.2 * 4 + 3  # they overlapped


def test_session_keeps_state_and_enforces_limits(pool: SandboxPool) -> None:
    with pool.session(timeout_s=1.0) as s:
        assert s.run("x = 20\nopen('f', 'w').write('kept')").ok
        r = s.run("x += 1\nprint(x, open('f').read())")
        assert r.stdout == "21 kept\n"
        bad = s.run("raise KeyError('k')")  # an exception does not end the session
        assert bad.exit_code == 1 and s.alive
        assert s.run("print(x)").stdout == "21\n"
        slow = s.run("import time; time.sleep(10)")
        assert slow.timed_out and not s.alive and s.ended_reason == "timeout"
        after = s.run("print(x)")
        assert after.killed_reason == "session_ended" and after.exit_code is None
    assert wait_until_gone() == []


def test_session_cpu_budget_spans_calls(pool: SandboxPool) -> None:
    with pool.session(timeout_s=5.0, session_cpu_s=2) as s:
        r = s.run("while True: pass")
        assert r.killed_reason == "cpu_time_limit" and not s.alive


def test_pool_recovers_when_the_zygote_dies() -> None:
    with SandboxPool(size=1) as p:
        assert p.run("print(1)").stdout == "1\n"
        assert p._proc is not None
        p._proc.kill()
        p._proc.wait()
        r = p.run("print(2)")
        assert r.stdout == "2\n" and p.restarts == 1


def test_closed_pool_refuses() -> None:
    from relax_gym.tools import SandboxError

    p = SandboxPool(size=1)
    p.close()
    with pytest.raises(SandboxError, match="closed"):
        p.run("print(1)")


def test_rlimits_mode_runs_and_cleans_up(rlimits_pool: SandboxPool) -> None:
    caps = rlimits_pool.capabilities
    assert not (caps["network"] or caps["filesystem"] or caps["pid"])
    r = rlimits_pool.run("import os\nopen('f', 'w').write('x')\nprint(os.getcwd())")
    assert r.ok
    workdir = r.stdout.strip()
    assert workdir.startswith("/tmp/relax-sandbox-")
    deadline = time.monotonic() + 3
    while os.path.exists(workdir) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(workdir)  # removed by the supervisor


def test_auto_mode_keeps_the_interpreter_importable() -> None:
    """Under "auto", a uid is only dropped where the code can still import the standard library."""
    with SandboxPool(size=1, isolation="rlimits") as p:
        caps = p.capabilities
        assert caps["uid"] == (caps["root"] and caps["python_readable"])
        r = p.run("import subprocess, email.mime.text, json\nprint('imported')")
        assert r.stdout == "imported\n", r.stderr


def test_namespace_mode_hides_the_host_home_but_not_the_interpreter(pool: SandboxPool) -> None:
    if not pool.capabilities["filesystem"]:
        pytest.skip("no mount namespace")
    import json
    import sys

    home = os.path.expanduser("~root")
    code = (
        "import json, os, decimal, xml.dom.minidom\n"
        "try:\n"
        f"    print(json.dumps(sorted(os.listdir({home!r}))))\n"
        "except PermissionError:\n"
        "    print(json.dumps('denied'))\n"
    )
    r = pool.run(code)
    assert r.ok, r.stderr  # stdlib modules import after the uid drop
    listing = json.loads(r.stdout)
    if listing != "denied":
        # only the way to the interpreter is visible in a home directory that hid it
        visible = {p[len(home) + 1 :].split("/")[0] for p in (sys.base_prefix, sys.prefix) if p.startswith(home + "/")}
        assert set(listing) <= visible, listing


@pytest.mark.parametrize("mode", ["namespaces", "rlimits"])
def test_death_by_signal_is_reported(mode: str, request: pytest.FixtureRequest) -> None:
    p: SandboxPool = request.getfixturevalue("pool" if mode == "namespaces" else "rlimits_pool")
    r = p.run("import os, signal\nprint('before', flush=True)\nos.kill(os.getpid(), signal.SIGSEGV)")
    assert r.exit_code == -11 and r.killed_reason == "crashed (SIGSEGV)" and r.stdout == "before\n"
    r = p.run("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)")
    assert r.exit_code == -15 and r.killed_reason == "killed by signal SIGTERM"


def test_supervisor_backstop_kills_when_the_host_stalls(pool: SandboxPool) -> None:
    """The host normally enforces the deadline; if it stalls, the supervisor kills anyway."""
    from relax_gym.tools.sandbox import _zygote
    from relax_gym.tools.sandbox.pool import _read_supervisor

    worker = pool._claim()
    try:
        assert worker.wait_ready(30) is None
        _zygote._write_fd_message(worker.fds["req"], {"code": "import time; time.sleep(60)", "limits": pool.limits.to_wire(), "session": False})
        start = time.monotonic()
        worker.notify({"type": "call", "timeout_s": 0.3})  # ...and then the host does nothing
        while worker.exited is None and time.monotonic() - start < 10:
            import select

            select.select([worker.sock], [], [], 0.5)
            _read_supervisor(worker)
        elapsed = time.monotonic() - start
        assert worker.exited is not None and worker.exited.get("type") == "exit"
        assert 0.3 + _zygote.BACKSTOP_MARGIN_S - 0.2 < elapsed < 0.3 + _zygote.BACKSTOP_MARGIN_S + 3
    finally:
        worker.close()


def test_supervisor_dying_mid_call_is_reported(pool: SandboxPool) -> None:
    import signal as sig

    from relax_gym.tools.sandbox.pool import _call

    worker = pool._claim()
    try:
        assert worker.wait_ready(30) is None
        lim = pool.limits.with_overrides(timeout_s=20)
        killer = threading.Timer(0.5, lambda: os.kill(worker.pid, sig.SIGKILL))
        killer.start()
        start = time.monotonic()
        reply = _call(worker, {"code": "import time; time.sleep(60)", "limits": lim.to_wire(), "session": False}, lim)
        assert time.monotonic() - start < 5
        assert str(reply["killed_reason"]).startswith("sandbox_error") and reply["exit_code"] is None
    finally:
        worker.close()
    assert wait_until_gone() == []


def test_a_forked_child_gets_its_own_pool(pool: SandboxPool) -> None:
    """multiprocessing may fork a process that holds a started pool: the child must not use
    the parent's zygote and sockets, and the parent's pool must keep working."""
    assert pool.run("print('parent')").stdout == "parent\n"
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        try:
            r = pool.run("print('child')")
            os.write(write_end, r.stdout.encode() or b"-")
        finally:
            os._exit(0)
    os.close(write_end)
    got = os.read(read_end, 100)
    os.close(read_end)
    os.waitpid(child, 0)
    assert got == b"child\n"
    assert pool.run("print('parent again')").stdout == "parent again\n"


def test_closing_an_rlimits_pool_leaves_no_work_directories() -> None:
    """Idle workers made their work directory ahead of time; closing the pool removes it."""
    import glob

    before = set(glob.glob("/tmp/relax-sandbox-*"))
    with SandboxPool(size=2, isolation="rlimits") as p:
        assert p.run("print(1)").stdout == "1\n"
        time.sleep(0.3)  # let the replacement workers finish their set-up
    deadline = time.monotonic() + 5
    while set(glob.glob("/tmp/relax-sandbox-*")) - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert set(glob.glob("/tmp/relax-sandbox-*")) - before == set()
