"""``python``: run model-written code in the sandbox (``relax_gym.tools.sandbox``).

``make_python_tool()`` builds the tool with its limits; ``stateful=True`` gives each episode a
:class:`~relax_gym.tools.sandbox.PythonSession` (a REPL whose variables persist between calls;
closed when the episode ends). If a call kills the session (timeout, crash), the next call
starts a fresh one and says so.
"""

from __future__ import annotations

from typing import Any

from .declaration import Tool, ToolContext, tool
from .sandbox import PythonSession, SandboxLimits, SandboxPool, default_pool


def make_python_tool(
    *,
    stateful: bool = False,
    name: str = "python",
    timeout_s: float = 10.0,
    memory_mb: int = 512,
    pool: SandboxPool | None = None,
    **limits: Any,
) -> Tool:
    """A python tool with these :class:`SandboxLimits` (``pool`` defaults to the shared one)."""
    lim = SandboxLimits(timeout_s=timeout_s, memory_mb=memory_mb, **limits)
    where = "Variables and files persist between calls in this episode." if stateful else (
        "Each call starts fresh: no variables or files survive between calls."
    )
    description = (
        "Run Python 3 code in a sandbox and return what it prints (stdout, then stderr). "
        f"{where} No network access; files only in the working directory; time limit "
        f"{lim.timeout_s:g} s, memory {lim.memory_mb} MB. Use print() to see results."
    )

    if not stateful:

        def run(code: str) -> str:
            """(described below)

            Args:
                code: Python source to execute.
            """
            target = pool or default_pool()
            return target.run(code, lim).summary()

        return tool(run, name=name, description=description)

    key = f"python_session:{name}"

    def run_in_session(code: str, ctx: ToolContext) -> str:
        """(described below)

        Args:
            code: Python source to execute; earlier variables are still defined.
        """
        session: PythonSession | None = ctx.scratch.get(key)
        note = ""
        if session is not None and not session.alive:
            note = f"[the previous session ended ({session.ended_reason}); variables were reset]\n"
            session = None
        if session is None:
            session = (pool or default_pool()).session(lim)
            ctx.scratch[key] = session
            ctx.on_episode_end(session.close)
        return note + session.run(code).summary()

    return tool(run_in_session, name=name, description=description)


python = make_python_tool()
