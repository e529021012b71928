"""A Report as one self-contained HTML page: the kernel table and the plan's graph.

TF-free. The graph is the one the trace runs (Report.graph): each fused
kernel one coloured node (its ops listed on a click), TF ops grey, folded
in name scopes that open on a click, with a search by op name or type;
static/report_page.js draws one scope at a time with Cytoscape.js (html_page.py).
"""

from __future__ import annotations

import collections
import html
from typing import List

from tf_fusionstitch import html_page, report_text

CSS = """
#crumbs { padding: 5px 14px; background: #eceff1; font-size: 14px; }
#main { display: flex; height: 72vh; border-bottom: 1px solid #cfd8dc; }
#graph { flex: 1; min-width: 0; }
#side { width: 340px; border-left: 1px solid #cfd8dc; display: flex; flex-direction: column; }
#tools { padding: 8px; border-bottom: 1px solid #e0e0e0; }
#tools input { width: 190px; padding: 3px; }
#tools button { margin-top: 4px; }
#legend { padding: 8px; color: #455a64; border-bottom: 1px solid #e0e0e0; }
#info { padding: 8px; margin: 0; overflow: auto; flex: 1; font-size: 12px; white-space: pre; }
#info a { color: #1565c0; }
#kernels { padding: 6px 14px 30px 14px; }
tr[data-kernel] { cursor: pointer; }
tr[data-kernel]:hover, tr.selected { background: #fff8e1; }
td.reason { color: #b71c1c; max-width: 520px; }
"""


def scope_of(name: str) -> str:
    return name.rpartition("/")[0]


def kernel_scope(names: List[str]) -> str:
    """Where a kernel of ops named `names` is drawn: the deepest name scope
    that holds more than half of them (a pack's parts, or a gradient kernel
    that takes an op of the forward pass, span scopes; at the scope common
    to all, most would sit at the top of the graph)."""
    counts = collections.Counter()
    for name in names:
        parts = scope_of(name).split("/") if scope_of(name) else []
        for depth in range(len(parts) + 1):
            counts["/".join(parts[:depth])] += 1
    held = [s for s, n in counts.items() if 2 * n > len(names)]
    return max(held, key=lambda s: (s.count("/") + bool(s), s)) if held else ""


def folded(scopes: List[str]) -> List[str]:
    """Each unit's scope, a scope that would hold only that unit dissolved
    into its parent (TF names an op's constants in a scope of their own:
    "dense/mul/y"), until no such scope is left."""
    scopes = list(scopes)
    while True:
        units_in = collections.Counter(scopes)
        with_children = {s.rsplit("/", i)[0] for s in units_in for i in range(1, s.count("/") + 1)}
        changed = False
        for i, s in enumerate(scopes):
            if s and units_in[s] == 1 and s not in with_children:
                scopes[i] = scope_of(s)
                changed = True
        if not changed:
            return scopes


# A scope shows at most this many boxes: past it, its ops are grouped by op type
# (an optimizer's hundreds of "adam/Sub_12") and its child scopes by name.
MAX_BOXES = 40


def join(scope: str, name: str) -> str:
    return f"{scope}/{name}" if scope else name


def regrouped(units: list, limit: int = MAX_BOXES) -> None:
    """Rewrites the scope of `units` ([name, op, kernel, scope]) so that no
    scope holds more than about `limit` boxes: a crowded scope's ops go into
    groups "[Op xN]" (fused kernels into "[fused kernels xN]"), in chunks of
    `limit` by name, and its child scopes into groups "[first … last]".
    "[" is never in a TF name, so a group is never taken for a scope."""
    tree = collections.defaultdict(lambda: ([], set()))
    for i, unit in enumerate(units):
        tree[unit[3]][0].append(i)
        parts = unit[3].split("/") if unit[3] else []
        for depth in range(len(parts)):
            tree["/".join(parts[:depth])][1].add(parts[depth])

    def chunks(items):
        return [items[j:j + limit] for j in range(0, len(items), limit)]

    def walk(old: str, new: str) -> None:
        here, children = tree[old][0], sorted(tree[old][1])
        crowded = len(here) + len(children) > limit
        kinds = collections.defaultdict(list)
        for i in here:
            kinds["fused kernels" if units[i][2] >= 0 else units[i][1]].append(i)
        for kind, members in kinds.items():
            members.sort(key=lambda i: units[i][0])
            parts = chunks(members) if crowded and len(members) > 1 else [members]
            for n, part in enumerate(parts):
                label = (f"[{kind} x{len(members)}]" if len(parts) == 1 else
                         f"[{kind} {n * limit + 1}-{n * limit + len(part)} of {len(members)}]")
                for i in part:
                    units[i][3] = join(new, label) if crowded and len(members) > 1 else new
        groups = chunks(children) if len(children) > limit else [children]
        for group in groups:
            prefix = new if len(groups) == 1 else join(new, f"[{group[0]} … {group[-1]}]")
            for child in group:
                walk(join(old, child), join(prefix, child))

    walk("", "")


def graph_data(report) -> dict:
    """What report_page.js draws: the graph's nodes as units (a FusionStitch
    node is its kernel, placed in the scope common to its ops), the edges,
    and the fused kernels in the table's numbering."""
    fused = report.fused_clusters
    kernel_of = {c.name: k for k, c in enumerate(fused)}
    units = []
    for name, op in report.graph.nodes:
        k = kernel_of.get(name, -1) if op == "FusionStitch" else -1
        scope = kernel_scope([n for n, _ in fused[k].tf_ops] or [name]) if k >= 0 \
            else scope_of(name)
        units.append([name, op, k, scope])
    for unit, scope in zip(units, folded([u[3] for u in units])):
        unit[3] = scope
    regrouped(units)
    kernels = [{"name": c.name, "ops": [list(o) for o in c.tf_ops],
                "kinds": report_text.op_kinds(c.tf_ops, shown=3)} for c in fused]
    return {"units": units, "edges": [list(e) for e in report.graph.edges], "kernels": kernels}


def kernel_table(report) -> str:
    """One row per cluster: fused kernels numbered as in the graph."""
    rows, k = [], 0
    for c in report.clusters:
        kinds = html.escape(report_text.op_kinds(c.tf_ops)) if c.tf_ops else ""
        all_ops = html.escape(", ".join(f"{op} {name}" for name, op in c.tf_ops))
        name = html.escape(c.name)
        if c.fused:
            swatch = f'<span class="swatch" style="background: hsl({k * 137.508 % 360:.1f}, ' \
                     f'65%, 46%)"></span>'
            rows.append(
                f'<tr data-kernel="{k}" id="kernel-{k}"><td class="num">{swatch}{k}</td>'
                f'<td>{name}</td><td class="num">{len(c.tf_ops)}</td>'
                f'<td title="{all_ops}">{kinds}</td>'
                f'<td class="num">{html.escape(report_text.bytes_text(*c.bytes_in))}</td>'
                f'<td class="num">{html.escape(report_text.bytes_text(*c.bytes_out))}</td>'
                f'<td>{html.escape(report_text.loops_text(c))}</td>'
                f'<td class="num">{c.parts}</td><td>fused</td></tr>')
            k += 1
        else:
            status = f"split into {c.split} parts" if c.split else "fallback"
            rows.append(
                f'<tr><td></td><td>{name}</td><td class="num">{len(c.tf_ops)}</td>'
                f'<td title="{all_ops}">{kinds}</td><td></td><td></td><td></td><td></td>'
                f'<td class="reason">{status}: {html.escape(c.reason)}</td></tr>')
    head = ("<tr><th>kernel</th><th>node</th><th>ops</th><th>op kinds</th><th>in</th>"
            "<th>out</th><th>loops</th><th>parts</th><th>status</th></tr>")
    return f"<table>{head}{''.join(rows)}</table>"


def unfused_table(report) -> str:
    if not report.unfused_ops:
        return ""
    rows = "".join(f"<tr><td>{html.escape(n)}</td><td>{html.escape(op)}</td>"
                   f"<td>{html.escape(why)}</td></tr>" for n, op, why in report.unfused_ops)
    return (f"<h2>{len(report.unfused_ops)} fusible-class ops left as TF ops</h2>"
            f"<table><tr><th>node</th><th>op</th><th>why</th></tr>{rows}</table>")


def page(report) -> str:
    summary = report_text.summary(report).splitlines()
    header_text = "\n".join(line.strip() for line in summary[1:]
                            if not line.lstrip().startswith("["))
    body = f"""<header><h1>{html.escape(summary[0])}</h1>
<div class="sub">{html.escape(header_text)}</div></header>
<div id="crumbs"></div>
<div id="main"><div id="graph"></div><div id="side">
<div id="tools"><input id="search" placeholder="search op name or type, Enter">
<span id="found"></span><br>
<button id="top">top scope</button> <button id="fit">fit</button></div>
<div id="legend"><span class="swatch" style="background: hsl(0, 65%, 46%)"></span>a fused
kernel (click: its ops)<br><span class="swatch" style="background: #cfd8dc"></span>a TF op
left as it is<br><span class="swatch" style="background: linear-gradient(to right, #ffb74d
50%, #eceff1 50%)"></span>a name scope (click to open it; orange: the share of its ops
fused)<br>yellow outline: search matches; dashed: edges from or to outside this scope
(click to go up)</div>
<pre id="info">Click a kernel or an op.</pre></div></div>
<div id="kernels"><h2>Kernels</h2>{kernel_table(report)}{unfused_table(report)}</div>
{html_page.json_script("plan-data", graph_data(report))}"""
    return html_page.page(f"tf_fusionstitch: {report.function}", body, "", CSS,
                          libraries=html_page.LIBRARIES + ("report_page.js",))


def save(report, path) -> None:
    html_page.write(path, page(report))
