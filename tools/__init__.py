"""Tools for relax-gym environments: declaration, tool-call parsing, sandboxed execution and
the ``ToolEnv`` wrapper. See docs/tools.md.

::

    from relax_gym.tools import ToolEnv, calculator, python, zoom, tool

    @tool
    def lookup(word: str) -> str:
        '''Look a word up in the dictionary.'''
        ...

    env = ToolEnv(my_env, tools=[calculator, python, zoom, lookup], max_tool_calls=8)
"""

from .answer_tools import ANSWER_TOOL_NAMES, finish, submit_answer
from .builtin import builtin_tools
from .calculator import calculator
from .declaration import (
    Tool,
    ToolArgumentError,
    ToolContext,
    ToolError,
    ToolRegistry,
    ToolResult,
    as_tool,
    tool,
)
from .env import ToolEnv
from .image_tools import crop, rotate, zoom
from .parsers import (
    HermesParser,
    OpenAIParser,
    ParseError,
    ParseResult,
    Qwen3CoderParser,
    ToolCallParser,
    get_parser,
    list_parsers,
    register_parser,
    strip_thinking,
)
from .python_tool import make_python_tool, python
from .sandbox import (
    ExecResult,
    PythonSession,
    SandboxError,
    SandboxLimits,
    SandboxPool,
    configure_default_pool,
    default_pool,
    run_python,
)
from .search import BM25Index, Document, search

__all__ = [
    "ANSWER_TOOL_NAMES",
    "BM25Index",
    "Document",
    "ExecResult",
    "HermesParser",
    "OpenAIParser",
    "ParseError",
    "ParseResult",
    "PythonSession",
    "Qwen3CoderParser",
    "SandboxError",
    "SandboxLimits",
    "SandboxPool",
    "Tool",
    "ToolArgumentError",
    "ToolCallParser",
    "ToolContext",
    "ToolEnv",
    "ToolError",
    "ToolRegistry",
    "ToolResult",
    "as_tool",
    "builtin_tools",
    "calculator",
    "configure_default_pool",
    "crop",
    "default_pool",
    "finish",
    "get_parser",
    "list_parsers",
    "make_python_tool",
    "python",
    "register_parser",
    "rotate",
    "run_python",
    "search",
    "strip_thinking",
    "submit_answer",
    "tool",
    "zoom",
]
