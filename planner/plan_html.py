"""A Plan as one self-contained HTML page: the device mesh, the variables'
splits, and the pipeline schedule as a timeline. TF-free.

The timeline places each stage's forwards and backwards of the micro-batches in
the order micro_batches.schedule gives ("gpipe" or "1f1b"), each as early as
its stage and the stage it depends on allow, with the data-parallel gradient
all-reduce after a stage's last backward. A plan keeps no per-stage times, so
the time axis is in slots: a forward takes one, a backward two (assumed, as
for a typical layer). Cytoscape.js draws it (tf_fusionstitch/html_page.py).
"""

import html

from tf_fusionstitch import html_page
from tf_fusionstitch.planner import ir, micro_batches

FORWARD_SLOTS, BACKWARD_SLOTS, ALL_REDUCE_SLOTS = 1, 2, 1

CSS = """
section { padding: 4px 14px 10px 14px; }
#timeline { max-height: 60vh; border: 1px solid #cfd8dc; }
.mesh td.device { background: #e3f2fd; border: 1px solid #90caf9; text-align: center;
                  font-size: 12px; padding: 4px 8px; }
.note { color: #546e7a; }
"""


def timeline(stages: int, micro: int, kind: str, replicas: int) -> list:
    """[(stage, label, phase, micro-batch, start slot, slots)] of one step.
    phase: "forward", "backward" or "all-reduce"."""
    orders = micro_batches.schedule(kind, stages, micro)
    end = {}                       # (stage, micro-batch, phase) -> end slot
    free = [0] * stages            # when each stage is next idle
    position = [0] * stages        # next entry of each stage's order
    blocks = []
    while any(position[s] < len(orders[s]) for s in range(stages)):
        progressed = False
        for s in range(stages):
            while position[s] < len(orders[s]):
                m, phase = orders[s][position[s]]
                if phase == ir.FORWARD:
                    needs = [(s - 1, m, ir.FORWARD)] if s > 0 else []
                else:
                    needs = [(s, m, ir.FORWARD)] + (
                        [(s + 1, m, ir.BACKWARD)] if s + 1 < stages else [])
                if any(n not in end for n in needs):
                    break
                start = max([free[s]] + [end[n] for n in needs])
                slots = FORWARD_SLOTS if phase == ir.FORWARD else BACKWARD_SLOTS
                label = f"{'F' if phase == ir.FORWARD else 'B'}{m}"
                blocks.append((s, label, phase, m, start, slots))
                end[(s, m, phase)] = free[s] = start + slots
                position[s] += 1
                progressed = True
        if not progressed:
            raise ValueError(f"the {kind} schedule of {stages} stages deadlocks")
    if replicas > 1:
        for s in range(stages):
            blocks.append((s, f"all-reduce\n{replicas} replicas", "all-reduce", -1, free[s],
                           ALL_REDUCE_SLOTS))
    return blocks


def plural(n: int, what: str) -> str:
    return f"{n} {what}{'s' if n != 1 else ''}"


def mesh_table(plan) -> str:
    spec = plan.cluster_spec
    head = "".join(f"<th>replica {r}</th>" for r in range(plan.replicas))
    rows = []
    for s in range(plan.num_stages):
        devices = plan.stage_devices(s)
        cells = []
        for r in range(plan.replicas):
            shards = devices[r * plan.tensor_parallel:(r + 1) * plan.tensor_parallel]
            cells.append("<td>" + " ".join(
                f'<table style="display:inline-table"><tr><td class="device">'
                f"{html.escape(spec.device_name(d))}"
                + (f"<br>shard {t}" if plan.tensor_parallel > 1 else "")
                + "</td></tr></table>" for t, d in enumerate(shards)) + "</td>")
        rows.append(f"<tr><th>stage {s}<br><span class='note'>{len(plan.stages[s])} ops"
                    f"</span></th>{''.join(cells)}</tr>")
    return f'<table class="mesh"><tr><th></th>{head}</tr>{"".join(rows)}</table>'


def splits_table(plan) -> str:
    if not plan.variable_splits:
        return "<p class='note'>no variables</p>"
    ordered = sorted(plan.variable_splits.items(), key=lambda kv: (kv[1] is None, kv[0]))
    rows = "".join(
        f"<tr><td>{html.escape(name)}</td><td>"
        + ("replicated" if axis is None else
           f"split on axis {axis} over {plan.tensor_parallel} shards") + "</td></tr>"
        for name, axis in ordered)
    split = sum(a is not None for a in plan.variable_splits.values())
    return (f"<p>{split} of {len(plan.variable_splits)} variables split</p>"
            f"<table><tr><th>variable</th><th>how</th></tr>{rows}</table>")


def collectives_text(plan) -> str:
    parts = []
    if plan.tp_collectives:
        parts.append("each forward and backward block holds the tensor-parallel "
                     "collectives of one micro-batch: " + ", ".join(
                         f"{k} x{v}" for k, v in sorted(plan.tp_collectives.items())))
    if plan.replicas > 1:
        parts.append(f"the gradients are all-reduced over the {plan.replicas} replicas "
                     "after a stage's last backward")
    if plan.num_stages > 1:
        parts.append("arrows: activations sent to the next stage, gradients back")
    text = "; ".join(parts) or "no collectives: one replica, no tensor parallelism"
    return text[0].upper() + text[1:]


SCRIPT = """
(function () {
  const data = JSON.parse(document.getElementById("plan-data").textContent);
  const SLOT = 64, ROW = 46, colours = {forward: "#64b5f6", backward: "#ffb74d",
                                        "all-reduce": "#ba68c8"};
  const els = [];
  for (let s = 0; s < data.stages; s++) {
    els.push({data: {id: "stage" + s, label: "stage " + s, kind: "row",
                     w: 80, colour: "#ffffff"}, position: {x: -60, y: s * ROW}});
  }
  data.blocks.forEach((b, i) => {
    const [stage, label, phase, micro, start, slots] = b;
    els.push({data: {id: "b" + i, label, kind: phase, w: slots * SLOT - 6,
                     colour: colours[phase], key: stage + "/" + micro + "/" + phase},
              position: {x: (start + slots / 2) * SLOT, y: stage * ROW}});
  });
  const id = new Map(els.map(e => [e.data.key, e.data.id]));
  data.blocks.forEach(b => {
    const [stage, , phase, micro] = b;
    const next = phase === "forward" ? stage + 1 : stage - 1;
    const to = id.get(next + "/" + micro + "/" + phase);
    if (phase !== "all-reduce" && to) {
      els.push({data: {id: "e" + stage + "/" + micro + phase, source:
                       id.get(stage + "/" + micro + "/" + phase), target: to}});
    }
  });
  const slots = Math.max(...data.blocks.map(b => b[4] + b[5]));
  for (let t = 0; t <= slots; t++) {
    els.push({data: {id: "t" + t, label: String(t), kind: "tick", w: 20, colour: "#fff"},
              position: {x: t * SLOT, y: data.stages * ROW - 10}});
  }
  const cy = cytoscape({
    container: document.getElementById("timeline"), elements: els,
    layout: {name: "preset", padding: 20}, autoungrabify: true, wheelSensitivity: 0.3,
    style: [
      {selector: "node", style: {"shape": "round-rectangle", "width": "data(w)",
        "height": 34, "label": "data(label)", "text-valign": "center", "text-halign": "center",
        "font-size": 15, "background-color": "data(colour)", "border-width": 1,
        "border-color": "#455a64"}},
      {selector: "node[kind = 'all-reduce']", style: {"font-size": 11, "text-wrap": "wrap",
        "text-max-width": "data(w)"}},
      {selector: "node[kind = 'row']", style: {"border-width": 0, "font-weight": "bold",
        "font-size": 15}},
      {selector: "node[kind = 'tick']", style: {"border-width": 0, "height": 14,
        "font-size": 13, "color": "#78909c"}},
      {selector: "edge", style: {"width": 1.2, "line-color": "#78909c",
        "target-arrow-shape": "triangle", "target-arrow-color": "#78909c",
        "curve-style": "straight", "arrow-scale": 0.7}},
    ],
  });
  // A short schedule would fill the box at a giant zoom: keep blocks their size.
  if (cy.zoom() > 1.2) { cy.zoom(1.2); cy.center(); }
})();
"""


def page(plan) -> str:
    lines = str(plan).splitlines()
    blocks = timeline(plan.num_stages, plan.micro_batches, plan.schedule, plan.replicas)
    body = f"""<header><h1>{html.escape(lines[0])}</h1>
<div class="sub">{html.escape(chr(10).join(l.strip() for l in lines[1:3]))}</div></header>
<section><h2>Pipeline schedule ({html.escape(plan.schedule)}, {plan.micro_batches}
micro-batch{"es" if plan.micro_batches != 1 else ""})</h2>
<p class="note">F3 / B3: the forward / backward of micro-batch 3 on a stage (every replica
runs the same); time in slots, a forward one, a backward two (assumed: the plan keeps no
per-stage times). {html.escape(collectives_text(plan))}.</p>
<div id="timeline" style="height: {110 + 46 * plan.num_stages}px"></div></section>
<section><h2>Device mesh: {plural(plan.replicas, "replica")} x {plan.tensor_parallel}-way
tensor parallel x {plural(plan.num_stages, "stage")}</h2>{mesh_table(plan)}</section>
<section><h2>Variables</h2>{splits_table(plan)}</section>
{html_page.json_script("plan-data", {"stages": plan.num_stages, "blocks": blocks})}"""
    return html_page.page(f"tf_fusionstitch plan: {lines[0]}", body, SCRIPT, CSS,
                          libraries=html_page.LIBRARIES[:1])


def save(plan, path) -> None:
    html_page.write(path, page(plan))
