"""The sympy worker process: parses and compares math answers, one JSON request per line.

It runs as a separate script (``python -P _sympy_worker_main.py MEMORY_MB``) so that a parse or
simplification that never ends, or eats all memory, can be killed without touching the caller.
It imports nothing from relax_gym. Protocol (stdin -> stdout, one JSON object per line)::

    -> {"op": "scalars", "pairs": [[a, b], ...], "rel_tol": 1e-6}
    <- {"ok": true, "result": [true, false, null, ...]}      # null: a side could not be parsed
    -> {"op": "equations", "pairs": [[a, b], ...], "rel_tol": 1e-6}
    <- {"ok": false, "error": "..."}                          # the request itself failed

On start it prints ``{"ready": true, "latex": <bool>, "latex_error": <str|null>}``. It exits on
end of input, so it never outlives its parent.
"""

from __future__ import annotations

import json
import os
import random
import re
import sys

# Protocol replies go to a private copy of stdout; anything a library prints goes to stderr.
_OUT = os.fdopen(os.dup(1), "wb", buffering=0)
os.dup2(2, 1)


def _limit_memory(memory_mb: int) -> None:
    if memory_mb <= 0:
        return
    try:
        import resource

        limit = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (ImportError, ValueError, OSError):  # not on this platform: the timeout still applies
        pass


def _send(obj: dict) -> None:
    _OUT.write((json.dumps(obj) + "\n").encode("utf-8"))


try:
    import sympy
    from sympy import E, Symbol, oo, pi, simplify
    from sympy.core.relational import Relational
    from sympy.parsing.sympy_parser import (
        convert_xor,
        implicit_multiplication_application,
        parse_expr,
        standard_transformations,
    )
except ImportError as _exc:  # reported to the parent instead of dying with a traceback
    _send({"ready": False, "error": f"sympy is not installed ({_exc}); pip install sympy"})
    sys.exit(3)

try:
    from sympy.parsing.latex import parse_latex

    parse_latex("1")  # the ANTLR runtime is imported lazily; check it works now
    LATEX_ERROR: str | None = None
except Exception as exc:  # noqa: BLE001 -- reported in the ready line
    LATEX_ERROR = f"{type(exc).__name__}: {exc}"

# Plain (non-LaTeX) answers such as "sqrt(2)/2" or "2*pi": only these names and single letters
# are allowed, so parse_expr (which evaluates Python) cannot reach anything but sympy math.
_FUNCS = {"sqrt", "pi", "sin", "cos", "tan", "log", "ln", "exp", "oo", "inf", "infinity", "abs"}
_PLAIN_CHARS = re.compile(r"^[0-9A-Za-z+\-*/^().,\s]*$")
_IDENT = re.compile(r"[A-Za-z]+")
_TRANSFORMS = standard_transformations + (implicit_multiplication_application, convert_xor)
_LOCALS = {
    "e": E, "E": E, "pi": pi, "oo": oo, "inf": oo, "infinity": oo, "ln": sympy.log, "abs": sympy.Abs,
    "I": Symbol("I"), "i": Symbol("i"), "N": Symbol("N"), "S": Symbol("S"), "Q": Symbol("Q"),
    "O": Symbol("O"),
}


class ParseError(Exception):
    pass


class LatexUnavailable(Exception):
    """sympy's LaTeX parser cannot run here: every LaTeX comparison would be wrong, so the
    whole request fails instead of answering "not equal"."""


def _is_plain(s: str) -> bool:
    if "\\" in s or "{" in s or not _PLAIN_CHARS.match(s):
        return False
    return all(len(w) == 1 or w.lower() in _FUNCS for w in _IDENT.findall(s))


def parse(s: str):
    s = s.strip()
    if not s:
        raise ParseError("empty")
    if _is_plain(s):
        try:
            return parse_expr(s, local_dict=dict(_LOCALS), transformations=_TRANSFORMS, evaluate=True)
        except Exception:  # noqa: BLE001 -- fall back to the LaTeX parser
            pass
    if LATEX_ERROR is not None:
        raise LatexUnavailable(
            f"sympy's LaTeX parser is unavailable ({LATEX_ERROR}); install antlr4-python3-runtime==4.11.*"
        )
    try:
        expr = parse_latex(s)
    except Exception as exc:  # noqa: BLE001
        raise ParseError(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None
    # LaTeX "e" is Euler's number in answers; the parser makes it a plain symbol.
    return expr.subs(Symbol("e"), E) if hasattr(expr, "subs") else expr


def _close(a: complex, b: complex, rel_tol: float) -> bool:
    return abs(a - b) <= max(rel_tol * max(abs(a), abs(b)), 1e-12)


def _numeric(x):
    v = complex(sympy.N(x, 30))
    return v


def expr_equal(a, b, rel_tol: float) -> bool:
    if a == b:
        return True
    if isinstance(a, Relational) or isinstance(b, Relational):
        if isinstance(a, Relational) and isinstance(b, Relational) and a.rel_op == b.rel_op:
            return expr_equal(a.lhs - a.rhs, b.lhs - b.rhs, rel_tol)
        return False
    if not (isinstance(a, sympy.Basic) and isinstance(b, sympy.Basic)):
        return False
    if a.has(oo, -oo, sympy.zoo) or b.has(oo, -oo, sympy.zoo):
        return simplify(a) == simplify(b)
    diff = simplify(a - b)
    if diff == 0:
        return True
    symbols = sorted(a.free_symbols | b.free_symbols, key=str)
    if not symbols:
        try:
            return _close(_numeric(a), _numeric(b), rel_tol)
        except (TypeError, ValueError):
            return False
    rng = random.Random(0)
    for _ in range(4):
        point = {s: sympy.Rational(rng.randint(11, 97), rng.randint(5, 13)) for s in symbols}
        try:
            if not _close(_numeric(a.subs(point)), _numeric(b.subs(point)), rel_tol):
                return False
        except (TypeError, ValueError, ZeroDivisionError):
            return False
    return True


def equation_equal(a, b, rel_tol: float) -> bool:
    """``l1 = r1`` and ``l2 = r2`` are the same equation when l1-r1 is a nonzero constant
    multiple of l2-r2."""
    if not (isinstance(a, sympy.Equality) and isinstance(b, sympy.Equality)):
        return expr_equal(a, b, rel_tol)
    d1, d2 = a.lhs - a.rhs, b.lhs - b.rhs
    if expr_equal(d1, d2, rel_tol) or expr_equal(d1, -d2, rel_tol):
        return True
    if d2 == 0:
        return False
    ratio = simplify(d1 / d2)
    return bool(ratio.is_number and ratio != 0 and not ratio.has(sympy.zoo, sympy.nan))


def _parse_equation(s: str):
    if s.count("=") == 1 and not re.search(r"[<>!]=|=[<>]|\\[lg]eq?", s):
        left, right = s.split("=")
        return sympy.Eq(parse(left), parse(right), evaluate=False)
    return parse(s)


def handle(req: dict) -> dict:
    op = req.get("op")
    rel_tol = float(req.get("rel_tol", 1e-6))
    pairs = req.get("pairs") or []
    out: list[bool | None] = []
    errors: list[str | None] = []
    for a_text, b_text in pairs:
        try:
            if op == "scalars":
                a, b = parse(a_text), parse(b_text)
                out.append(bool(expr_equal(a, b, rel_tol)))
            elif op == "equations":
                a, b = _parse_equation(a_text), _parse_equation(b_text)
                out.append(bool(equation_equal(a, b, rel_tol)))
            else:
                return {"ok": False, "error": f"unknown op {op!r}"}
            errors.append(None)
        except ParseError as exc:
            out.append(None)
            errors.append(str(exc))
        except RecursionError:
            out.append(None)
            errors.append("expression too deeply nested")
        except LatexUnavailable as exc:
            return {"ok": False, "config": True, "error": str(exc)}
    return {"ok": True, "result": out, "errors": errors}


def main() -> None:
    _limit_memory(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    _send({"ready": True, "latex": LATEX_ERROR is None, "latex_error": LATEX_ERROR})
    for line in sys.stdin.buffer:
        try:
            reply = handle(json.loads(line))
        except MemoryError:
            reply = {"ok": False, "error": "out of memory"}
        except Exception as exc:  # noqa: BLE001 -- the request failed, the worker lives on
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        _send(reply)


if __name__ == "__main__":
    main()
