"""Start a stdio MCP server under a memory ceiling: ``python -m relax_gym.tools._mcp_launch MB -- argv...``.

Sets RLIMIT_AS (address space) to MB mebibytes, then replaces itself with the server, so the
SDK's stdio pipes and process handling see the server itself. A server that runs away with
memory fails its own allocation instead of taking the machine down.
"""

from __future__ import annotations

import os
import resource
import sys


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m relax_gym.tools._mcp_launch MB -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    limit = int(argv[0]) << 20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    command = argv[2:]
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"cannot start {command[0]!r}: {exc.strerror or exc}", file=sys.stderr)
        return 127
    return 0  # pragma: no cover - execvp does not return


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
