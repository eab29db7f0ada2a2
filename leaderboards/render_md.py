"""Leaderboards as Markdown (GitHub-flavoured tables), one section per comparable group."""

from __future__ import annotations

import html
import re

from .table import Group, Row, split_notes

METHOD = (
    "Scores are means over envs of the per-env {metric}; brackets are 95% bootstrap confidence "
    "intervals over tasks (seeds, with their attempts), fixed RNG seed. The normalised score is "
    "(success - random) / (oracle - random) with each env's stored baselines: 0 is chance, 1 the oracle."
)


# control characters, line and paragraph separators, zero-width and bidi-override characters: they
# break table rows, hide text or make one label read as another (U+202E reverses what follows)
_INVISIBLE = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]+")
# ASCII punctuation with a meaning in (GitHub-flavoured) Markdown inside a line: emphasis, code,
# links and images, strikethrough, headings, table cells, math; escaped with a backslash
_MD_PUNCT = re.compile(r"([\\`*_\[\]()!~#|{}$^])")


def clean_text(value: object) -> str:
    """``value`` as one line of visible text: control, zero-width and bidi characters become spaces."""
    return _INVISIBLE.sub(" ", str(value))


def md_text(value: object) -> str:
    """``value`` as literal Markdown text, safe in a table cell, a heading or a paragraph: one line,
    ``& < >`` as HTML entities (no raw HTML or autolinks), Markdown punctuation backslash-escaped
    (no links, images, code spans, emphasis or extra cells)."""
    return _MD_PUNCT.sub(r"\\\1", html.escape(clean_text(value), quote=False))


def md_code(value: object) -> str:
    """``value`` in code font; ``<code>`` instead of backticks, since a code span would show the
    escapes literally and a backtick in ``value`` would end it."""
    return f"<code>{md_text(value)}</code>"


def _row_cells(g: Group, r: Row, ranked: bool) -> list[str]:
    cells = [str(r.rank) if ranked else "–", md_text(r.label), md_code(r.agent), r.score.text()]
    if g.metric == "normalised":
        cells.append(r.success.text())
    cells += [r.modalities[m].text() if m in r.modalities else "–" for m in g.modality_columns]
    if g.has_tools:
        cells.append(r.tools.text() if r.tools else "–")
    cells += [str(r.episodes), str(r.errors)]
    return cells


def render_group(g: Group, title: str | None = None) -> str:
    lines = [f"## {md_text(title or g.suite)}", ""]
    envs = ", ".join(f"{md_text(e)} ({md_text(g.env_versions.get(e, '-'))})" for e in g.envs)
    lines.append(f"Envs: {envs}  ")
    lines.append(f"Metric: {g.metric_label}; comparability key {md_code(g.key)}.")
    lines.append("")
    head = ["#", "Model", "Agent", "Score" if g.metric == "normalised" else "Success"]
    if g.metric == "normalised":
        head.append("Success")
    head += [md_text(m) for m in g.modality_columns]
    if g.has_tools:
        head.append("tools")
    head += ["Episodes", "Errors"]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "|".join(["---"] * 3 + ["---:"] * (len(head) - 3)) + "|")
    for r in g.rows:
        lines.append("| " + " | ".join(_row_cells(g, r, True)) + " |")
    for r in g.unranked:
        lines.append("| " + " | ".join(_row_cells(g, r, False)) + " |")
    if g.unranked:
        lines += ["", f"Unranked (incomplete runs): {', '.join(md_text(r.label) for r in g.unranked)}."]
    lines += ["", f"Per env ({g.metric_label}):", ""]
    head = ["Model"] + [md_text(e) for e in g.envs]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|---|" + "|".join(["---:"] * len(g.envs)) + "|")
    for r in g.rows + g.unranked:
        lines.append(
            "| " + " | ".join([md_text(r.label)] + [r.envs[e].text() if e in r.envs else "–" for e in g.envs]) + " |"
        )
    return "\n".join(lines)


def render_markdown(groups: list[Group], *, title: str = "relax-gym leaderboard") -> str:
    parts = [f"# {md_text(title)}", ""]
    if not groups:
        parts += ["No runs indexed yet.", ""]
        return "\n".join(parts)
    metrics = sorted({g.metric_label for g in groups})
    parts += [METHOD.format(metric=" / ".join(metrics)), ""]
    for note in split_notes(groups):
        parts += [f"> {md_text(note)}", ""]
    for g in groups:
        parts += [render_group(g), ""]
    return "\n".join(parts)


__all__ = ["clean_text", "md_code", "md_text", "render_group", "render_markdown"]
