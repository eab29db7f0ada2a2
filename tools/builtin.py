"""The tools that ship with relax-gym, by name."""

from __future__ import annotations

from .answer_tools import finish, submit_answer
from .calculator import calculator
from .declaration import ToolRegistry
from .image_tools import crop, rotate, zoom
from .python_tool import python
from .search import search


def builtin_tools() -> ToolRegistry:
    """A fresh registry of every built-in tool (the sandbox starts only when python runs)."""
    return ToolRegistry([calculator, python, search, crop, zoom, rotate, submit_answer, finish])
