"""``calculator``: arithmetic by walking the expression's AST -- no ``eval``, no names beyond a
fixed table of constants and functions, and bounds on every operation that could blow up
(huge powers, factorials, shifts, string-free inputs only).

Integers stay exact; ``/`` gives a float (exact integers when it divides evenly). ``^`` means
power, as models write it. The answer is the result as text.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

from .declaration import ToolError, tool

MAX_EXPRESSION_CHARS = 500
MAX_INT_BITS = 4096  # ~1233 decimal digits
MAX_EXPONENT = 10_000
MAX_FACTORIAL = 1000
MAX_DEPTH = 50

Number = int | float

_CONSTANTS: dict[str, Number] = {"pi": math.pi, "e": math.e, "tau": math.tau, "inf": math.inf}


def _factorial(x: Number) -> int:
    if isinstance(x, float):
        if not x.is_integer():
            raise ToolError("factorial() needs a whole number")
        x = int(x)
    if x < 0 or x > MAX_FACTORIAL:
        raise ToolError(f"factorial() needs 0 <= n <= {MAX_FACTORIAL}")
    return math.factorial(x)


def _log(x: Number, base: Number | None = None) -> float:
    return math.log(x) if base is None else math.log(x, base)


_FUNCTIONS: dict[str, Callable[..., Number]] = {
    "sqrt": math.sqrt,
    "cbrt": lambda x: math.copysign(abs(x) ** (1 / 3), x),
    "exp": math.exp,
    "log": _log,
    "ln": math.log,
    "log2": math.log2,
    "log10": math.log10,
    "sin": math.sin,
    "cos": math.cos,
    "tan": math.tan,
    "asin": math.asin,
    "acos": math.acos,
    "atan": math.atan,
    "atan2": math.atan2,
    "sinh": math.sinh,
    "cosh": math.cosh,
    "tanh": math.tanh,
    "degrees": math.degrees,
    "radians": math.radians,
    "abs": abs,
    "round": lambda x, n=0: round(x, int(n)) if n else round(x),
    "floor": math.floor,
    "ceil": math.ceil,
    "trunc": math.trunc,
    "min": min,
    "max": max,
    "factorial": _factorial,
    "gcd": lambda a, b: math.gcd(int(a), int(b)),
    "lcm": lambda a, b: math.lcm(int(a), int(b)),
    "comb": lambda n, k: math.comb(int(n), int(k)) if n <= MAX_FACTORIAL else _too_big("comb"),
    "perm": lambda n, k: math.perm(int(n), int(k)) if n <= MAX_FACTORIAL else _too_big("perm"),
    "hypot": math.hypot,
}


def _too_big(what: str) -> int:
    raise ToolError(f"{what}() argument too large (limit {MAX_FACTORIAL})")


def _check_size(value: Number) -> Number:
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise ToolError(f"result too large (more than {MAX_INT_BITS} bits)")
    return value


def _power(a: Number, b: Number) -> Number:
    if abs(b) > MAX_EXPONENT:
        raise ToolError(f"exponent too large (limit {MAX_EXPONENT})")
    if (
        isinstance(a, int)
        and isinstance(b, int)
        and b >= 0
        and a not in (0, 1, -1)
        and abs(a).bit_length() * b > MAX_INT_BITS
    ):
        raise ToolError(f"result too large (more than {MAX_INT_BITS} bits)")
    result = a**b
    if isinstance(result, complex):
        raise ToolError("the result is not a real number")
    return result


def _divide(a: Number, b: Number) -> Number:
    if b == 0:
        raise ToolError("division by zero")
    if isinstance(a, int) and isinstance(b, int) and a % b == 0:
        return a // b
    return a / b


def _floordiv(a: Number, b: Number) -> Number:
    if b == 0:
        raise ToolError("division by zero")
    return a // b


def _mod(a: Number, b: Number) -> Number:
    if b == 0:
        raise ToolError("modulo by zero")
    return a % b


_BINOPS: dict[type[ast.operator], Callable[[Any, Any], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: _divide,
    ast.FloorDiv: _floordiv,
    ast.Mod: _mod,
    ast.Pow: _power,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Number]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def evaluate(expression: str) -> Number:
    """Evaluate an arithmetic expression safely; raises ToolError with a readable reason."""
    if not isinstance(expression, str) or not expression.strip():
        raise ToolError("the expression is empty")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    # models write 2^10 for a power; as a token it must also bind like **, hence the rewrite
    text = expression.strip().replace("×", "*").replace("÷", "/").replace("−", "-").replace("^", "**")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise ToolError(f"cannot parse {expression!r}: {exc.msg}") from None
    except (RecursionError, MemoryError):
        raise ToolError("the expression is nested too deeply") from None
    try:
        return _eval(tree.body, 0)
    except ToolError:
        raise
    except (OverflowError, ValueError, ZeroDivisionError, TypeError) as exc:
        raise ToolError(f"cannot evaluate {expression!r}: {exc}") from None


def _eval(node: ast.AST, depth: int) -> Number:
    if depth > MAX_DEPTH:
        raise ToolError("the expression is nested too deeply")
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise ToolError(f"only numbers are allowed, got {node.value!r}")
        return _check_size(node.value)
    if isinstance(node, ast.Name):
        if node.id in _CONSTANTS:
            return _CONSTANTS[node.id]
        raise ToolError(f"unknown name {node.id!r}; constants: {', '.join(_CONSTANTS)}")
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _eval(node.left, depth + 1), _eval(node.right, depth + 1)
        return _check_size(_BINOPS[type(node.op)](left, right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand, depth + 1))
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in _FUNCTIONS:
            name = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)
            raise ToolError(f"unknown function {name!r}; functions: {', '.join(_FUNCTIONS)}")
        if node.keywords:
            raise ToolError("keyword arguments are not supported")
        args = [_eval(a, depth + 1) for a in node.args]
        return _check_size(_FUNCTIONS[node.func.id](*args))
    raise ToolError(f"unsupported syntax: {ast.unparse(node)!r} (use numbers, + - * / // % ** ^, parentheses and functions)")


def format_number(value: Number) -> str:
    """Integers exactly; floats with up to 15 significant digits (integral floats as ints)."""
    if isinstance(value, float):
        if math.isfinite(value) and value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return f"{value:.15g}"
    return str(value)


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly and return the result.

    Supports + - * / // % ** (also ^ for power), parentheses, the constants pi, e and tau, and
    the functions sqrt, cbrt, exp, log (natural, or log(x, base)), log2, log10, sin, cos, tan,
    asin, acos, atan, atan2, sinh, cosh, tanh, degrees, radians, abs, round, floor, ceil,
    trunc, min, max, factorial, gcd, lcm, comb, perm and hypot. Angles are in radians.

    Args:
        expression: The expression, e.g. "(3 + 4) * 2^10 / sqrt(2)".
    """
    return format_number(evaluate(expression))
