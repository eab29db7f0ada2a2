"""Leaderboards as Markdown (GitHub-flavoured tables), one section per comparable group."""

from __future__ import annotations

from .table import Group, Row, split_notes

METHOD = (
    "Scores are means over envs of the per-env {metric}; brackets are 95% bootstrap confidence "
    "intervals over tasks (seeds, with their attempts), fixed RNG seed. The normalised score is "
    "(success - random) / (oracle - random) with each env's stored baselines: 0 is chance, 1 the oracle."
)


def _esc(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _row_cells(g: Group, r: Row, ranked: bool) -> list[str]:
    cells = [str(r.rank) if ranked else "–", _esc(r.label), f"`{_esc(r.agent)}`", r.score.text()]
    if g.metric == "normalised":
        cells.append(r.success.text())
    cells += [r.modalities[m].text() if m in r.modalities else "–" for m in g.modality_columns]
    if g.has_tools:
        cells.append(r.tools.text() if r.tools else "–")
    cells += [str(r.episodes), str(r.errors)]
    return cells


def render_group(g: Group, title: str | None = None) -> str:
    lines = [f"## {title or g.suite}", ""]
    envs = ", ".join(f"{e} ({g.env_versions.get(e, '-')})" for e in g.envs)
    lines.append(f"Envs: {envs}  ")
    lines.append(f"Metric: {g.metric_label}; comparability key `{g.key}`.")
    lines.append("")
    head = ["#", "Model", "Agent", "Score" if g.metric == "normalised" else "Success"]
    if g.metric == "normalised":
        head.append("Success")
    head += g.modality_columns
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
        lines += ["", f"Unranked (incomplete runs): {', '.join(_esc(r.label) for r in g.unranked)}."]
    lines += ["", f"Per env ({g.metric_label}):", ""]
    head = ["Model"] + g.envs
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|---|" + "|".join(["---:"] * len(g.envs)) + "|")
    for r in g.rows + g.unranked:
        lines.append(
            "| " + " | ".join([_esc(r.label)] + [r.envs[e].text() if e in r.envs else "–" for e in g.envs]) + " |"
        )
    return "\n".join(lines)


def render_markdown(groups: list[Group], *, title: str = "relax-gym leaderboard") -> str:
    parts = [f"# {title}", ""]
    if not groups:
        parts += ["No runs indexed yet.", ""]
        return "\n".join(parts)
    metrics = sorted({g.metric_label for g in groups})
    parts += [METHOD.format(metric=" / ".join(metrics)), ""]
    for note in split_notes(groups):
        parts += [f"> {note}", ""]
    for g in groups:
        parts += [render_group(g), ""]
    return "\n".join(parts)


__all__ = ["render_group", "render_markdown"]
