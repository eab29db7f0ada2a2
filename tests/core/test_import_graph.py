"""The package's import graph: no cycles, no edge against the layer order, no torch where it is not needed.

Every module of the installed package is parsed with ``ast`` (never imported), so the test is
fast and sees imports that a run would only reach on some paths. Folders map to their installed
names as in pyproject.toml (``envs/`` is ``relax_gym.envs``, ...). An import becomes an edge to
the deepest module of the package it names: ``from a.b import c`` is an edge to ``a.b.c`` when
that is a module, else to ``a.b`` (whose ``__init__`` then runs). Parent packages are not edges:
Python puts a package in ``sys.modules`` before running its submodules, so ``a.b -> a`` never
fails at import time and would make every package a cycle.

How imports count:

- *Module-level* imports (anywhere outside a function, including ``try``/``if`` blocks) run when
  the module is imported. A cycle among them is an import-time cycle: its result depends on
  which module is imported first.
- *Lazy* imports (inside a function) run when the function is called. They are counted too: a
  ring closed by a lazy import is still two modules that each need the other, which is the
  smell the rule is about (and the usual way a real cycle gets hidden). So the cycle check runs
  on all edges.
- ``if TYPE_CHECKING:`` imports never run; they are left out of the cycle check (annotations
  may name each other both ways) but still obey the layer rules.

Layer rules (docs/architecture.md): the core (``relax_gym`` and ``relax_gym.cli``), envs, tools
and rewards import nothing from trainer or leaderboards, lazily or not; leaderboards imports
nothing from trainer. The one sanctioned way down the layers is the CLI's subcommand table,
whose module names are strings loaded with ``importlib`` when the command runs; the test pins
which trainer and leaderboards modules that table may name.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# folder -> installed package name (pyproject.toml [tool.setuptools.package-dir]).
FOLDERS = {
    "relax_gym": "relax_gym",
    "envs": "relax_gym.envs",
    "tools": "relax_gym.tools",
    "rewards": "relax_gym.rewards",
    "trainer": "relax_gym.trainer",
    "leaderboards": "relax_gym.leaderboards",
}
UPPER = ("relax_gym.trainer", "relax_gym.leaderboards")
# The CLI's subcommands that live above the core, loaded by name only when run.
CLI_SUBCOMMANDS_ABOVE_CORE = {
    "relax_gym.trainer.engine_cli",
    "relax_gym.trainer.train_cli",
    "relax_gym.trainer.sft_cli",
    "relax_gym.trainer.models_cli",
    "relax_gym.leaderboards.eval_cli",
    "relax_gym.leaderboards.leaderboard_cli",
}


@dataclass(frozen=True)
class Edge:
    """One import statement of ``source`` that reaches ``target`` (both package modules)."""

    source: str
    target: str
    line: int
    lazy: bool
    type_only: bool

    def where(self) -> str:
        kind = "type-only" if self.type_only else "lazy" if self.lazy else "module-level"
        return f"{self.source}:{self.line} -> {self.target} ({kind})"


@cache
def modules() -> dict[str, tuple[Path, bool]]:
    """Installed module name -> (file, is a package ``__init__``)."""
    found: dict[str, tuple[Path, bool]] = {}
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            found[".".join([package, *parts])] = (path, is_package)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool, bool]]:
    """Each import statement with (lazy: inside a function, type_only: under TYPE_CHECKING)."""

    def walk(node: ast.AST, lazy: bool, type_only: bool) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool, bool]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, lazy, type_only
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                yield from walk(child, True, type_only)
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    yield from walk(ast.Module(body=[stmt], type_ignores=[]), lazy, True)
                for stmt in child.orelse:
                    yield from walk(ast.Module(body=[stmt], type_ignores=[]), lazy, type_only)
            else:
                yield from walk(child, lazy, type_only)

    yield from walk(tree, False, False)


def _deepest(name: str) -> str | None:
    """The longest prefix of ``name`` that is a package module, or None (not ours)."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules():
            return candidate
        parts.pop()
    return None


@cache
def edges() -> tuple[Edge, ...]:
    """Every import edge between package modules."""
    found: list[Edge] = []
    for name, (path, is_package) in modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        package = name if is_package else name.rpartition(".")[0]
        for node, lazy, type_only in _imports(tree):
            targets: list[str | None] = []
            if isinstance(node, ast.Import):
                targets = [_deepest(alias.name) for alias in node.names]
            else:
                if node.level:
                    base_parts = package.split(".")
                    base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                    base = ".".join(base_parts + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in modules() else _deepest(base))
            for target in targets:
                if target is not None and target != name:
                    found.append(Edge(name, target, node.lineno, lazy, type_only))
    return tuple(found)


def _layer(module: str) -> str:
    for upper in UPPER:
        if module == upper or module.startswith(upper + "."):
            return upper
    return "core"


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components of more than one module, iteratively (no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    result: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    result.append(sorted(component))
    return result


def _shortest_ring(graph: dict[str, set[str]], start: str, members: set[str]) -> list[str]:
    """The shortest chain start -> ... -> start inside one component (breadth first)."""
    parent: dict[str, str] = {}
    frontier = [start]
    seen = {start}
    while frontier:
        following: list[str] = []
        for node in frontier:
            for child in sorted(graph[node] & members):
                if child == start:
                    chain = [node]
                    while chain[-1] != start:
                        chain.append(parent[chain[-1]])
                    return [start, *reversed(chain[:-1]), start] if node != start else [start, start]
                if child not in seen:
                    seen.add(child)
                    parent[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"{start} is in a component but on no ring")


def find_cycles() -> list[str]:
    """One readable ring per strongly connected component, with the lines that close it."""
    graph: dict[str, set[str]] = {name: set() for name in modules()}
    lines: dict[tuple[str, str], list[Edge]] = {}
    for edge in edges():
        if edge.type_only:
            continue
        graph[edge.source].add(edge.target)
        lines.setdefault((edge.source, edge.target), []).append(edge)
    reports: list[str] = []
    for component in _strongly_connected(graph):
        ring = _shortest_ring(graph, component[0], set(component))
        steps = [min(lines[(a, b)], key=lambda e: (e.lazy, e.line)).where() for a, b in zip(ring, ring[1:])]
        reports.append(
            " -> ".join(ring) + f"  [component of {len(component)}: {', '.join(component)}]\n    "
            + "\n    ".join(steps)
        )
    return reports


def forbidden_edges() -> list[str]:
    """Imports against the layer order, type-only ones included."""
    bad: set[str] = set()
    for edge in edges():
        source, target = _layer(edge.source), _layer(edge.target)
        if (source == "core" and target != "core") or (
            source == "relax_gym.leaderboards" and target == "relax_gym.trainer"
        ):
            bad.add(edge.where())
    return sorted(bad)


def test_every_module_parses_and_the_graph_is_not_empty() -> None:
    assert "relax_gym.trainer.modes.async_runner" in modules() and "relax_gym.envs" in modules()
    assert any(e.source == "relax_gym.trainer.train_cli" for e in edges())


def test_the_cycle_finder_reports_each_ring_once() -> None:
    """The checker itself: two rings (one of three modules, one of two) and a tail outside them."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": {"d"}, "f": {"a"}}
    components = _strongly_connected(graph)
    assert sorted(components) == [["a", "b", "c"], ["d", "e"]]
    assert _shortest_ring(graph, "a", {"a", "b", "c"}) == ["a", "b", "c", "a"]
    assert _shortest_ring(graph, "d", {"d", "e"}) == ["d", "e", "d"]


def test_no_import_cycles() -> None:
    cycles = find_cycles()
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_no_import_against_the_layer_order() -> None:
    bad = forbidden_edges()
    assert not bad, "imports against the layer order (core < leaderboards < trainer):\n" + "\n".join(bad)


def test_cli_loads_only_the_listed_subcommands_from_above_the_core() -> None:
    """The subcommand table is the core's one way into trainer and leaderboards; pin its reach."""
    from relax_gym.cli.main import COMMANDS

    above = {module for module, _ in COMMANDS.values() if _layer(module) != "core"}
    assert above == CLI_SUBCOMMANDS_ABOVE_CORE


def test_core_and_config_validation_import_no_torch() -> None:
    """Making an env and validating a training config are CPU-light operations: no torch."""
    code = (
        "import sys\n"
        "import relax_gym\n"
        "env = relax_gym.make('relax/ArithmeticWord-v0'); env.reset(seed=0); env.close()\n"
        "assert 'torch' not in sys.modules, 'relax_gym.make imported torch'\n"
        "from relax_gym.trainer.config import load_config\n"
        "config = load_config('examples/quickstart.yaml')\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'ray', 'megatron', 'sglang') if m in sys.modules)\n"
        "assert not heavy, f'load_config imported {heavy}'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr


if __name__ == "__main__":  # a report of the whole graph while fixing it
    print("\n".join(find_cycles()) or "no cycles")
    print("\n".join(forbidden_edges()) or "no forbidden edges")
