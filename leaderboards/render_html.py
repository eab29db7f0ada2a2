"""Leaderboards as one static, self-contained HTML page: sortable tables with CIs and a bar chart.

Nothing is loaded from anywhere: styles and the sorting script are inline, the chart is inline
SVG drawn here, and a Content-Security-Policy forbids every other source, so the page renders
the same offline, from a file, or from any static host. Click a column header to sort (again to
reverse); ``page.html#sort=KEY:asc|desc`` opens it sorted (KEY is a column's ``data-key``, e.g.
``score``, ``label``, ``image``). Once the script has run, ``<body data-ready="1">``.
"""

from __future__ import annotations

import html
import json

from .render_md import METHOD, clean_text
from .table import Cell, Group, Row, split_notes

BAR = "#4e79a7"
BASELINE_BAR = "#bab0ac"
BASELINE_AGENTS = ("random", "oracle")

CSS = """
:root { --fg: #1f2328; --muted: #59636e; --line: #d1d9e0; --head: #f6f8fa; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg);
       margin: 24px auto; max-width: 1200px; padding: 0 16px; }
h1 { font-size: 24px; margin: 0 0 8px; } h2 { font-size: 19px; margin: 28px 0 6px; }
p.method, p.meta, p.note { color: var(--muted); margin: 4px 0; }
table.lb { border-collapse: collapse; width: 100%; margin: 10px 0 4px; font-variant-numeric: tabular-nums; }
table.lb th, table.lb td { border-bottom: 1px solid var(--line); padding: 5px 8px; text-align: right;
                           white-space: nowrap; }
table.lb th { background: var(--head); cursor: pointer; user-select: none; position: sticky; top: 0; }
table.lb th:hover { background: #eaeef2; }
table.lb th.text, table.lb td.text { text-align: left; }
table.lb th[aria-sort="ascending"]::after { content: " \\25B2"; font-size: 10px; }
table.lb th[aria-sort="descending"]::after { content: " \\25BC"; font-size: 10px; }
td .ci { color: var(--muted); font-size: 12px; }
tr.unranked td { color: var(--muted); font-style: italic; }
figure.chart { margin: 8px 0; } figure.chart svg { max-width: 100%; height: auto; }
figcaption { color: var(--muted); font-size: 12px; }
code { font-size: 12px; }
details { margin: 6px 0 18px; }
"""

SCRIPT = """
(function () {
  function value(td, type) {
    var v = td.getAttribute('data-v');
    if (type === 'num') {
      if (v === null || v === '') return null;
      var x = parseFloat(v);
      return isNaN(x) ? null : x;
    }
    return (v === null ? td.textContent : v).toLowerCase();
  }
  function sortBy(table, th, dir) {
    var heads = Array.prototype.slice.call(table.tHead.rows[0].cells);
    var idx = heads.indexOf(th), type = th.getAttribute('data-type'), sign = dir === 'asc' ? 1 : -1;
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows).map(function (r, i) { return [r, i]; });
    rows.sort(function (a, b) {
      var x = value(a[0].cells[idx], type), y = value(b[0].cells[idx], type);
      if (x === null && y === null) return a[1] - b[1];
      if (x === null) return 1;
      if (y === null) return -1;
      return x < y ? -sign : x > y ? sign : a[1] - b[1];
    });
    rows.forEach(function (r) { body.appendChild(r[0]); });
    heads.forEach(function (h) { h.removeAttribute('aria-sort'); });
    th.setAttribute('aria-sort', dir === 'asc' ? 'ascending' : 'descending');
  }
  function onHeader(table, th) {
    var cur = th.getAttribute('aria-sort');
    var first = th.getAttribute('data-type') === 'num' && th.getAttribute('data-key') !== 'rank' ? 'desc' : 'asc';
    var dir = cur === 'ascending' ? 'desc' : cur === 'descending' ? 'asc' : first;
    sortBy(table, th, dir);
  }
  var tables = document.querySelectorAll('table.sortable');
  Array.prototype.forEach.call(tables, function (table) {
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th) {
      th.tabIndex = 0;
      th.addEventListener('click', function () { onHeader(table, th); });
      th.addEventListener('keydown', function (e) {
        if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); onHeader(table, th); }
      });
    });
  });
  var m = /sort=([\\w.-]+):(asc|desc)/.exec(window.location.hash);
  if (m) {
    var want = m[2] === 'asc' ? 'ascending' : 'descending';
    Array.prototype.forEach.call(tables, function (table) {
      var th = table.querySelector('thead th[data-key="' + m[1] + '"]');
      // the same path as a user's clicks: at most two clicks reach either direction
      for (var i = 0; th && i < 3 && th.getAttribute('aria-sort') !== want; i++) th.click();
    });
  }
  document.body.setAttribute('data-ready', '1');
})();
"""


def _e(text: object) -> str:
    """Text for an element or a quoted attribute: escaped, and one line of visible characters."""
    return html.escape(clean_text(text), quote=True)


def _script_json(value: object) -> str:
    """JSON for a ``<script>`` data block: ``<``, ``>`` and ``&`` as ``\\u`` escapes, so no
    ``</script>`` or ``<!--`` in a title can end or derail the block."""
    text = json.dumps(value)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _num(cell: Cell | None) -> str:
    return "" if cell is None or cell.value is None else repr(round(cell.value, 6))


def _cell_td(cell: Cell | None, key: str) -> str:
    if cell is None or cell.value is None:
        return f'<td data-key="{key}" data-v="">–</td>'
    ci = ""
    if cell.low is not None and cell.high is not None:
        ci = f' <span class="ci">[{cell.low:.3f}, {cell.high:.3f}]</span>'
    return f'<td data-key="{key}" data-v="{_num(cell)}">{cell.value:.3f}{ci}</td>'


def _th(key: str, label: str, kind: str, title: str = "") -> str:
    cls = ' class="text"' if kind == "text" else ""
    tip = f' title="{_e(title)}"' if title else ""
    return f'<th data-key="{key}" data-type="{"text" if kind == "text" else "num"}"{cls}{tip}>{_e(label)}</th>'


def _main_table(g: Group, table_id: str) -> str:
    heads = [
        _th("rank", "#", "num"),
        _th("label", "Model", "text"),
        _th("agent", "Agent", "text"),
        _th(
            "score",
            "Score" if g.metric == "normalised" else "Success",
            "num",
            f"suite {g.metric_label}, mean over envs, 95% CI",
        ),
    ]
    if g.metric == "normalised":
        heads.append(_th("success", "Success", "num", "suite success rate, mean over envs, 95% CI"))
    heads += [_th(m, m, "num", f"{g.metric_label} over the {m} envs") for m in g.modality_columns]
    if g.has_tools:
        heads.append(_th("tools", "tools", "num", f"{g.metric_label} over the tool-use envs"))
    heads += [_th("episodes", "Episodes", "num"), _th("errors", "Errors", "num")]
    body = []
    for r in g.rows + g.unranked:
        ranked = r in g.rows
        cells = [
            f'<td data-key="rank" data-v="{r.rank if ranked else ""}">{r.rank if ranked else "–"}</td>',
            f'<td class="text" data-key="label" data-v="{_e(r.label.lower())}">{_e(r.label)}</td>',
            f'<td class="text" data-key="agent" data-v="{_e(r.agent.lower())}"><code>{_e(r.agent)}</code></td>',
            _cell_td(r.score, "score"),
        ]
        if g.metric == "normalised":
            cells.append(_cell_td(r.success, "success"))
        cells += [_cell_td(r.modalities.get(m), m) for m in g.modality_columns]
        if g.has_tools:
            cells.append(_cell_td(r.tools, "tools"))
        cells += [
            f'<td data-key="episodes" data-v="{r.episodes}">{r.episodes}</td>',
            f'<td data-key="errors" data-v="{r.errors}">{r.errors}</td>',
        ]
        cls = "" if ranked else ' class="unranked"'
        body.append(f'<tr data-run="{_e(r.run_id)}"{cls}>' + "".join(cells) + "</tr>")
    return (
        f'<table class="lb sortable" id="{table_id}"><thead><tr>{"".join(heads)}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table>"
    )


def _env_table(g: Group, table_id: str) -> str:
    heads = [_th("label", "Model", "text")] + [_th(f"env-{i}", e, "num", e) for i, e in enumerate(g.envs)]
    body = []
    for r in g.rows + g.unranked:
        cells = [f'<td class="text" data-key="label" data-v="{_e(r.label.lower())}">{_e(r.label)}</td>']
        cells += [_cell_td(r.envs.get(e), f"env-{i}") for i, e in enumerate(g.envs)]
        body.append(f'<tr data-run="{_e(r.run_id)}">' + "".join(cells) + "</tr>")
    return (
        f'<table class="lb sortable" id="{table_id}"><thead><tr>{"".join(heads)}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table>"
    )


def bar_chart(rows: list[Row], metric_label: str, chart_id: str) -> str:
    """Horizontal bars (one per ranked run) with 95% CI whiskers, as inline SVG."""
    label_w, bar_h, gap, width, pad = 220, 20, 8, 760, 12
    plot_w = width - label_w - 70
    lo = min([0.0] + [r.score.low for r in rows if r.score.low is not None])
    hi = max([1.0] + [r.score.high for r in rows if r.score.high is not None])
    span = hi - lo or 1.0

    def x(v: float) -> float:
        return label_w + (v - lo) / span * plot_w

    height = pad * 2 + 24 + len(rows) * (bar_h + gap)
    out = [
        f'<svg id="{chart_id}" class="bars" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" aria-label="{_e(metric_label)} by model">'
    ]
    axis_y = height - pad - 16
    ticks = [lo + span * i / 4 for i in range(5)]
    for t in ticks:
        out.append(
            f'<line x1="{x(t):.1f}" y1="{pad}" x2="{x(t):.1f}" y2="{axis_y}" stroke="#d1d9e0" stroke-width="1"/>'
        )
        out.append(
            f'<text x="{x(t):.1f}" y="{axis_y + 14}" font-size="11" text-anchor="middle" fill="#59636e">{t:.2f}</text>'
        )
    zero = x(0.0)
    for i, r in enumerate(rows):
        y = pad + i * (bar_h + gap)
        v = r.score.value if r.score.value is not None else 0.0
        colour = BASELINE_BAR if r.agent in BASELINE_AGENTS else BAR
        left, right = sorted((zero, x(v)))
        out.append(
            f'<text x="{label_w - 8}" y="{y + bar_h * 0.72:.1f}" font-size="12" text-anchor="end" '
            f'fill="#1f2328">{_e(r.label[:32])}</text>'
        )
        out.append(
            f'<rect class="bar" data-label="{_e(r.label)}" x="{left:.1f}" y="{y}" width="{max(right - left, 1):.1f}" '
            f'height="{bar_h}" fill="{colour}"><title>{_e(r.label)}: {r.score.text()}</title></rect>'
        )
        if r.score.low is not None and r.score.high is not None:
            cy = y + bar_h / 2
            out.append(
                f'<line class="ci" x1="{x(r.score.low):.1f}" y1="{cy}" x2="{x(r.score.high):.1f}" y2="{cy}" '
                'stroke="#1f2328" stroke-width="1.5"/>'
            )
            for end in (r.score.low, r.score.high):
                out.append(
                    f'<line x1="{x(end):.1f}" y1="{cy - 5}" x2="{x(end):.1f}" y2="{cy + 5}" '
                    'stroke="#1f2328" stroke-width="1.5"/>'
                )
        out.append(
            f'<text x="{x(max(v, r.score.high or v)) + 6:.1f}" y="{y + bar_h * 0.72:.1f}" font-size="11" '
            f'fill="#1f2328">{v:.3f}</text>'
        )
    out.append(f'<line x1="{zero:.1f}" y1="{pad}" x2="{zero:.1f}" y2="{axis_y}" stroke="#59636e" stroke-width="1"/>')
    out.append("</svg>")
    return "".join(out)


def render_html(groups: list[Group], *, title: str = "relax-gym leaderboard") -> str:
    sections = []
    for n, g in enumerate(groups):
        gid = f"g{n}"
        envs = ", ".join(f"{_e(e)} ({_e(g.env_versions.get(e, '-'))})" for e in g.envs)
        chart = (
            bar_chart(g.rows, g.metric_label, f"{gid}-chart") if g.rows else "<p class=note>No complete runs yet.</p>"
        )
        unranked = (
            f'<p class="note">Unranked (incomplete runs): {_e(", ".join(r.label for r in g.unranked))}</p>'
            if g.unranked
            else ""
        )
        sections.append(
            f'<section class="board" id="{gid}" data-suite="{_e(g.suite)}" data-key="{_e(g.key)}">'
            f"<h2>{_e(g.suite)}</h2>"
            f'<p class="meta">Envs: {envs}. Metric: {_e(g.metric_label)}. '
            f"Comparability key <code>{_e(g.key)}</code>.</p>"
            f'<figure class="chart">{chart}<figcaption>{_e(g.metric_label)} by model, 95% CI whiskers '
            f"(grey: random and oracle baselines)</figcaption></figure>"
            f"{_main_table(g, f'{gid}-table')}{unranked}"
            f"<details><summary>Per env ({_e(g.metric_label)})</summary>{_env_table(g, f'{gid}-envs')}</details>"
            "</section>"
        )
    notes = "".join(f'<p class="note">{_e(n)}</p>' for n in split_notes(groups))
    metrics = " / ".join(sorted({g.metric_label for g in groups})) or "score"
    body = "".join(sections) if sections else "<p>No runs indexed yet.</p>"
    data = _script_json({"title": title, "groups": len(groups)})
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
        "script-src 'unsafe-inline'; img-src data:\">"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{CSS}</style></head>"
        f'<body data-ready="0"><h1>{_e(title)}</h1><p class="method">{_e(METHOD.format(metric=metrics))}</p>'
        f'{notes}{body}<script type="application/json" id="lb-meta">{data}</script><script>{SCRIPT}</script>'
        "</body></html>\n"
    )


__all__ = ["bar_chart", "render_html"]
