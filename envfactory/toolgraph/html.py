"""A self-contained HTML view of one environment's subgraph: an inline SVG plus parameter tables.

No scripts and nothing fetched (these machines are offline): the layout is computed here. Tools
are placed in columns by how many dependency steps they are from a tool the user can call directly
(no required internal input); edges carry their `via` parameters as hover titles; LLM edges are
dashed. The tables list every input with `user_provided`, who decided it and why.
"""

from __future__ import annotations

from collections import deque
from html import escape

from envfactory.toolgraph.graph import ToolGraph

_W, _H, _GAP_X, _GAP_Y, _PAD = 210, 38, 90, 22, 30
_COLORS = {"read": "#dbeafe", "write": "#fde68a"}


def _layers(graph: ToolGraph, tools: list[str]) -> dict[str, int]:
    """Steps from a directly callable tool along Tool_Depend edges (unreachable ones go last)."""
    inside = set(tools)
    roots = [t for t in tools if not any(graph.required(p) and not graph.user_provided(p) for p in graph.inputs(t))]
    layer = {t: 0 for t in roots}
    queue = deque(roots)
    while queue:
        t = queue.popleft()
        for s in graph.successor_tools(t):
            if s in inside and s not in layer:
                layer[s] = layer[t] + 1
                queue.append(s)
    last = max(layer.values(), default=-1) + 1
    return {t: layer.get(t, last) for t in tools}


def _svg(graph: ToolGraph, env: str) -> str:
    tools = graph.tools(env)
    layer = _layers(graph, tools)
    columns: dict[int, list[str]] = {}
    for t in tools:
        columns.setdefault(layer[t], []).append(t)
    pos: dict[str, tuple[int, int]] = {}
    for col, members in sorted(columns.items()):
        for row, t in enumerate(members):
            pos[t] = (_PAD + col * (_W + _GAP_X), _PAD + row * (_H + _GAP_Y))
    width = _PAD * 2 + (max(columns, default=0) + 1) * (_W + _GAP_X) - _GAP_X
    height = _PAD * 2 + max((len(m) for m in columns.values()), default=1) * (_H + _GAP_Y)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
        'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#555"/></marker></defs>',
    ]
    for a, b, d in graph.depend_edges(env):
        (x1, y1), (x2, y2) = pos[a], pos[b]
        sx, sy, tx, ty = float(x1 + _W), y1 + _H / 2, float(x2), y2 + _H / 2
        if x2 <= x1:  # same or earlier column: loop around below
            sx, tx = x1 + _W / 2, x2 + _W / 2
            sy, ty = y1 + _H, y2 + _H
            path = f"M {sx} {sy} C {sx} {sy + 40} {tx} {ty + 40} {tx} {ty}"
        else:
            mid = (sx + tx) / 2
            path = f"M {sx} {sy} C {mid} {sy} {mid} {ty} {tx} {ty}"
        via = ", ".join(f"{v[0]} → {v[1]}" for v in d.get("via", [])) or "no parameter"
        title = f"{graph.node(a)['name']} → {graph.node(b)['name']}: {via}"
        if d.get("reason"):
            title += f" ({d['reason']})"
        dash = {"llm": ' stroke-dasharray="5,4"', "schema": ' stroke-dasharray="2,3"'}.get(str(d.get("found_by")), "")
        parts.append(
            f'<path class="edge" d="{path}" fill="none" stroke="#777" stroke-width="1.3"{dash} '
            'marker-end="url(#arrow)">'
            f"<title>{escape(title)}</title></path>"
        )
    for t in tools:
        x, y = pos[t]
        d = graph.node(t)
        fill = _COLORS.get(str(d.get("kind")), "#eee")
        parts.append(
            f'<g><rect x="{x}" y="{y}" width="{_W}" height="{_H}" rx="7" fill="{fill}" stroke="#444"/>'
            f'<text x="{x + 10}" y="{y + 16}" font-weight="bold">{escape(str(d["name"]))}</text>'
            f'<text x="{x + 10}" y="{y + 30}" fill="#555">{escape(str(d.get("kind", "")))}</text>'
            f"<title>{escape(str(d.get('description', '')))}</title></g>"
        )
    parts.append("</svg>")
    return "\n".join(parts)


def _tables(graph: ToolGraph, env: str) -> str:
    rows = []
    for t in graph.tools(env):
        d = graph.node(t)
        inputs = []
        for p in graph.inputs(t):
            pd = graph.node(p)
            badge = "user" if pd.get("user_provided") else "internal"
            inputs.append(
                f"<li><code>{escape(pd['name'])}</code> {escape(pd['json_type'])}"
                f"{' <b>required</b>' if pd.get('required') else ''} "
                f'<span class="{badge}">{badge}</span> <small>({escape(str(pd.get("user_provided_source", "")))}: '
                f"{escape(str(pd.get('user_provided_reason', '')))})</small></li>"
            )
        outputs = ", ".join(f"<code>{escape(graph.node(p)['name'])}</code>" for p in graph.outputs(t))
        rows.append(
            f"<tr><td><b>{escape(str(d['name']))}</b><br><small>{escape(str(d['kind']))}</small></td>"
            f"<td>{escape(str(d['description']))}</td><td><ul>{''.join(inputs) or '<li>none</li>'}</ul></td>"
            f"<td>{outputs or 'none'}</td></tr>"
        )
    return (
        "<table><tr><th>tool</th><th>description</th><th>inputs</th><th>outputs</th></tr>" + "".join(rows) + "</table>"
    )


def render_env_html(graph: ToolGraph, env: str) -> str:
    """The HTML page for `env` (KeyError when the graph has no such environment)."""
    if not graph.tools(env):
        raise KeyError(env)
    edges = graph.depend_edges(env)
    style = (
        "body{font-family:sans-serif;margin:24px;color:#222}table{border-collapse:collapse;margin-top:18px}"
        "td,th{border:1px solid #ccc;padding:6px;vertical-align:top;text-align:left}ul{margin:0;padding-left:16px}"
        ".user{background:#dcfce7;padding:0 4px}.internal{background:#fee2e2;padding:0 4px}"
        ".svg{overflow:auto;border:1px solid #ddd}"
    )
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>tool graph: {escape(env)}</title>'
        f"<style>{style}</style></head><body>"
        f"<h1>{escape(env)}</h1><p>{len(graph.tools(env))} tools, {len(edges)} dependencies "
        f"({sum(d.get('found_by') == 'llm' for _, _, d in edges)} from the LLM, dashed; "
        f"{sum(d.get('found_by') == 'schema' for _, _, d in edges)} from the schemas only, dotted). "
        "Columns: steps from a tool the user can call directly. Hover an edge for the parameters it passes.</p>"
        f'<div class="svg">{_svg(graph, env)}</div>{_tables(graph, env)}</body></html>\n'
    )
