"""Start engine servers as child processes, wait for ``/health``, stop them cleanly.

:class:`ServerProcess` is the common part (command line, log file, health deadline, SIGTERM then
SIGKILL); :class:`EmbeddedEngineProcess` runs ``relax-gym engine serve`` on a free port. Tests,
benchmarks and the rollout manager use these to own real servers on 127.0.0.1::

    with EmbeddedEngineProcess("models/tiny") as engine:
        client = EngineClient(engine.url)
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import httpx

from relax_gym.errors import RelaxGymError


class ServerStartError(RelaxGymError, RuntimeError):
    """The server exited or did not become healthy in time; the message ends with its log tail."""


class Terminated(BaseException):
    """SIGTERM arrived inside :func:`sigterm_raises` (a BaseException, like KeyboardInterrupt)."""


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """Turn SIGTERM into :class:`Terminated` in the main thread while the block runs.

    A foreground launcher waits in Python (for ``/health``, then for its child); with the default
    disposition SIGTERM would kill it at once and leave the server it started -- in a session of
    its own -- running. Raised instead, it unwinds through the ``finally`` that stops the child.
    """

    def handler(signum: int, frame: object) -> None:
        raise Terminated(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def log_tail(path: str | Path | None, lines: int = 40) -> str:
    if path is None or not Path(path).exists():
        return ""
    text = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    return "\n".join(text[-lines:])


class ServerProcess:
    """A child process serving HTTP; its output goes to ``log_file``."""

    def __init__(
        self,
        command: list[str],
        *,
        log_file: str | Path,
        env: dict[str, str] | None = None,
        health_headers: dict[str, str] | None = None,
    ) -> None:
        self.command = command
        self.log_file = Path(log_file)
        self.env = env
        self.health_headers = health_headers or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_file, "ab")
        self.proc = subprocess.Popen(
            self.command, stdout=self._log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )

    def wait_healthy(self, url_fn: Any, *, timeout_s: float, poll_s: float = 0.2) -> None:
        """Poll ``url_fn()`` (a URL or None while unknown) until it answers 200, or fail."""
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=2.0, headers=self.health_headers) as http:
            while time.monotonic() < deadline:
                if not self.running:
                    code = self.proc.returncode if self.proc else None
                    raise ServerStartError(f"server exited with code {code}:\n{log_tail(self.log_file)}")
                url = url_fn()
                if url is not None:
                    try:
                        if http.get(url).status_code == 200:
                            return
                    except httpx.HTTPError:
                        pass
                time.sleep(poll_s)
        tail = log_tail(self.log_file)  # read before stop(), which may remove the log
        self.stop()
        raise ServerStartError(f"server not healthy after {timeout_s:.0f} s:\n{tail}")

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """SIGTERM the process group, then SIGKILL after ``timeout_s``. Returns the exit code."""
        code = None
        if self.proc is not None:
            if self.proc.poll() is None:
                self._signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    self._signal(signal.SIGKILL)
                    self.proc.wait(5)
            code = self.proc.returncode
        if self._log is not None:
            self._log.close()
            self._log = None
        return code

    def kill(self) -> None:
        """Kill at once (fault-injection tests: an engine that dies)."""
        if self.proc is not None and self.proc.poll() is None:
            self._signal(signal.SIGKILL)
            self.proc.wait(5)

    def _signal(self, sig: int) -> None:
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, sig)  # our own child's session, started above
        except ProcessLookupError:
            pass


class EmbeddedEngineProcess(ServerProcess):
    """``relax-gym engine serve --model PATH`` on 127.0.0.1 and a free port; it stops by itself
    if this process dies (``exit_with_parent``)."""

    def __init__(
        self,
        model: str | Path,
        *,
        port: int = 0,
        api_key: str | None = None,
        extra_args: list[str] | None = None,
        log_file: str | Path | None = None,
        threads: int | None = None,
        startup_timeout_s: float = 120.0,
        exit_with_parent: bool = True,
    ) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="relax-gym-engine-"))
        self.port_file = self._dir / "port"
        self.api_key = api_key
        self.startup_timeout_s = startup_timeout_s
        command = [
            sys.executable,
            "-m",
            "relax_gym.cli.main",
            "engine",
            "serve",
            "--model",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--port-file",
            str(self.port_file),
        ]
        if threads:
            command += ["--threads", str(threads)]
        if api_key:
            command += ["--api-key", api_key]
        if exit_with_parent:  # a parent killed before its clean-up runs leaves no engine behind
            command += ["--exit-with-parent"]
        command += list(extra_args or [])
        env = dict(os.environ)
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        super().__init__(command, log_file=log_file or self._dir / "engine.log", env=env)
        self.port: int | None = None

    @property
    def url(self) -> str:
        if self.port is None:
            raise ServerStartError("the engine is not started")
        return f"http://127.0.0.1:{self.port}"

    def _read_port(self) -> str | None:
        if self.port is None and self.port_file.exists():
            self.port = int(self.port_file.read_text())
        return f"{self.url}/health" if self.port is not None else None

    def start(self) -> None:
        super().start()
        self.wait_healthy(self._read_port, timeout_s=self.startup_timeout_s)

    def __enter__(self) -> EmbeddedEngineProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """Stop the server and remove its private folder (port file, and the log unless the
        caller chose where the log goes)."""
        code = super().stop(timeout_s)
        shutil.rmtree(self._dir, ignore_errors=True)
        return code


__all__ = ["EmbeddedEngineProcess", "ServerProcess", "ServerStartError", "Terminated", "log_tail", "sigterm_raises"]
