// The fusion plan's graph on a Report's page (tf_fusionstitch/report_html.py).
// One name scope is drawn at a time, its child scopes folded into boxes that open on a
// click, so a graph of thousands of nodes shows a few dozen boxes at a time.
// Cytoscape.js draws, dagre lays out.
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("plan-data").textContent);
  const units = data.units;        // [name, op type, kernel index or -1, scope]
  const kernels = data.kernels;    // {name, ops: [[name, op type]], kinds}
  const MAX_MATCHES = 200;         // search results listed
  const MIN_ZOOM = 0.8;            // a wider scope is shown from its top at this zoom
  const colour = k => `hsl(${(k * 137.508) % 360}, 65%, 46%)`;

  // The scope tree: path -> {name, parent, children, units, ops, fused, kernels}.
  const scopes = new Map();
  function scope(path) {
    let s = scopes.get(path);
    if (s) return s;
    const cut = path.lastIndexOf("/");
    const parent = path === "" ? null : (cut < 0 ? "" : path.slice(0, cut));
    s = {path, name: path.slice(cut + 1) || "(graph)", parent, children: [], units: [],
         ops: 0, fused: 0, kernels: 0};
    scopes.set(path, s);
    if (parent !== null) scope(parent).children.push(path);
    return s;
  }
  scope("");
  units.forEach((u, i) => {
    scope(u[3]).units.push(i);
    const n = u[2] >= 0 ? kernels[u[2]].ops.length : 1;
    for (let p = u[3]; p !== null; p = scopes.get(p).parent) {
      const s = scopes.get(p);
      s.ops += n;
      if (u[2] >= 0) { s.fused += n; s.kernels += 1; }
    }
  });
  const ancestors = path => {
    const out = [];
    for (let p = path; p !== null && p !== ""; p = scopes.get(p).parent) out.unshift(p);
    return out;
  };
  const unitOfKernel = new Map();
  units.forEach((u, i) => { if (u[2] >= 0) unitOfKernel.set(u[2], i); });

  // One scope is shown at a time: its units and its child scopes (folded), with the
  // edges between them, and one box each for what comes in from outside it and
  // what goes out. A click on a child scope shows that scope.
  let current = "";
  const inside = path => current === "" || path === current || path.startsWith(current + "/");
  function shown(i) {       // the box unit i is drawn in, in the current scope
    const path = units[i][3];
    if (!inside(path)) return "outside";
    if (path === current) return "u:" + i;
    const rest = current === "" ? path : path.slice(current.length + 1);
    const cut = rest.indexOf("/");
    return "s:" + (current === "" ? "" : current + "/") + (cut < 0 ? rest : rest.slice(0, cut));
  }

  function elements() {
    const nodes = new Map(), edges = new Map();
    const rep = units.map((u, i) => shown(i));
    units.forEach((u, i) => {
      const id = rep[i];
      if (nodes.has(id) || id === "outside") return;
      if (id.startsWith("s:")) {
        const path = id.slice(2), s = scopes.get(path);
        const share = Math.round(100 * s.fused / s.ops);
        nodes.set(id, {data: {
          id, kind: "scope", path,
          label: `${s.name}\n${s.ops} ops` + (s.kernels ? `, ${s.kernels} kernels` : ""),
          stops: `0% ${share}% ${share}% 100%`}});
      } else {
        const base = current ? u[0].slice(current.length + 1) : u[0];
        nodes.set(id, u[2] >= 0
          ? {data: {id, kind: "kernel", unit: i, colour: colour(u[2]),
                    label: `kernel ${u[2]}: ${kernels[u[2]].ops.length} ops\n${kernels[u[2]].kinds}`}}
          : {data: {id, kind: "op", unit: i, label: `${base}\n${u[1]}`}});
      }
    });
    const outer = {in: 0, out: 0};
    for (const [a, b] of data.edges) {
      let s = rep[a], t = rep[b];
      if (s === t) continue;
      if (s === "outside") { s = "in"; outer.in += 1; }
      if (t === "outside") { t = "out"; outer.out += 1; }
      const key = s + ">" + t;
      const e = edges.get(key);
      if (e) e.data.count += 1;
      else edges.set(key, {data: {id: "e:" + key, source: s, target: t, count: 1}});
    }
    if (outer.in) nodes.set("in", {data: {id: "in", kind: "outer",
                                          label: `from outside ${scopes.get(current).name}`}});
    if (outer.out) nodes.set("out", {data: {id: "out", kind: "outer",
                                            label: `to outside ${scopes.get(current).name}`}});
    for (const e of edges.values()) e.data.width = Math.min(1 + Math.log2(e.data.count), 6);
    return [...nodes.values(), ...edges.values()];
  }

  const cy = cytoscape({
    container: document.getElementById("graph"),
    wheelSensitivity: 0.3,
    style: [
      {selector: "node", style: {
        "label": "data(label)", "text-wrap": "wrap", "text-valign": "center",
        "text-halign": "center", "font-size": 11, "shape": "round-rectangle",
        "width": "label", "height": "label", "padding": "7px",
        "background-color": "#cfd8dc", "border-width": 1, "border-color": "#90a4ae"}},
      {selector: "node[kind = 'kernel']", style: {
        "background-color": "data(colour)", "color": "#fff", "font-weight": "bold",
        "border-color": "#263238", "border-width": 2}},
      {selector: "node[kind = 'scope']", style: {
        "background-fill": "linear-gradient", "background-gradient-direction": "to-right",
        "background-gradient-stop-colors": "#ffb74d #ffb74d #eceff1 #eceff1",
        "background-gradient-stop-positions": "data(stops)",
        "border-width": 2, "border-color": "#546e7a", "font-size": 12}},
      {selector: "node[kind = 'outer']", style: {
        "background-color": "#ffffff", "border-style": "dashed", "border-color": "#78909c",
        "color": "#546e7a", "font-style": "italic"}},
      {selector: "edge", style: {
        "width": "data(width)", "line-color": "#90a4ae", "target-arrow-color": "#90a4ae",
        "target-arrow-shape": "triangle", "curve-style": "bezier", "arrow-scale": 0.8}},
      {selector: ".match", style: {"border-color": "#fdd835", "border-width": 5}},
      {selector: ":selected", style: {"border-color": "#d500f9", "border-width": 5}},
    ],
  });

  const crumbs = document.getElementById("crumbs");
  function render(marked) {
    cy.elements().remove();
    cy.add(elements());
    cy.layout({name: "dagre", rankDir: "TB", nodeSep: 16, rankSep: 34, animate: false}).run();
    cy.fit(undefined, 24);
    if (cy.zoom() > 1.3) { cy.zoom(1.3); cy.center(); }
    if (cy.zoom() < MIN_ZOOM) {   // labels stay readable: show the top, pan for the rest
      const box = cy.elements().boundingBox();
      cy.zoom(MIN_ZOOM);
      cy.pan({x: cy.width() / 2 - MIN_ZOOM * (box.x1 + box.x2) / 2, y: 24 - MIN_ZOOM * box.y1});
    }
    crumbs.textContent = "";
    const path = ["", ...ancestors(current)];
    path.forEach((p, k) => {
      const link = document.createElement(p === current ? "b" : "a");
      link.textContent = scopes.get(p).name;
      if (p !== current) { link.href = "#"; link.onclick = e => { e.preventDefault(); go(p); }; }
      crumbs.append(link, k + 1 < path.length ? " / " : "");
    });
    if (marked) mark(marked);
  }
  function go(path, marked) { current = path; render(marked); }
  function mark(indices) {   // outline units and the child scopes that hold some of them
    const boxes = new Set(indices.map(shown).filter(id => id !== "outside"));
    cy.nodes().forEach(n => { if (boxes.has(n.id())) n.addClass("match"); });
  }

  const info = document.getElementById("info");
  function describe(i) {
    const u = units[i];
    if (u[2] < 0) {
      info.textContent = `${u[0]}\nTF op ${u[1]} (not fused)`;
      return;
    }
    const k = kernels[u[2]];
    info.textContent = `kernel ${u[2]}: ${k.name}\n${k.ops.length} ops: ${k.kinds}\n\n` +
      k.ops.map(o => `${o[1]}  ${o[0]}`).join("\n");
    document.querySelectorAll("tr.selected").forEach(r => r.classList.remove("selected"));
    const row = document.getElementById("kernel-" + u[2]);
    if (row) row.classList.add("selected");
  }

  cy.on("tap", "node", event => {
    const d = event.target.data();
    if (d.kind === "scope") go(d.path, lastHits);
    else if (d.kind === "outer") go(scopes.get(current).parent || "", lastHits);
    else if (d.unit !== undefined) describe(d.unit);
  });

  const search = document.getElementById("search"), found = document.getElementById("found");
  let lastHits = [];
  search.addEventListener("keydown", event => {
    if (event.key !== "Enter") return;
    const q = search.value.trim().toLowerCase();
    lastHits = [];
    if (q) units.forEach((u, i) => {
      const text = u[2] >= 0 ? kernels[u[2]].ops.map(o => o.join(" ")).join(" ") : u[0] + " " + u[1];
      if (text.toLowerCase().includes(q)) lastHits.push(i);
    });
    found.textContent = q ? `${lastHits.length} match${lastHits.length === 1 ? "" : "es"}` : "";
    info.textContent = "";
    lastHits.slice(0, MAX_MATCHES).forEach(i => {
      const link = document.createElement("a");
      link.href = "#";
      const tail = units[i][0].split("/").slice(-3).join("/");
      link.textContent = (units[i][2] >= 0 ? `kernel ${units[i][2]}: ` : `${units[i][1]}: `) + tail;
      link.title = units[i][0];
      link.onclick = e => { e.preventDefault(); go(units[i][3], lastHits); describe(i); };
      info.append(link, "\n");
    });
    if (lastHits.length > MAX_MATCHES) info.append(`... and ${lastHits.length - MAX_MATCHES} more`);
    render(lastHits);
  });
  document.getElementById("top").addEventListener("click", () => go("", lastHits));
  document.getElementById("fit").addEventListener("click", () => cy.fit(undefined, 24));
  document.querySelectorAll("tr[data-kernel]").forEach(row => row.addEventListener("click", () => {
    const i = unitOfKernel.get(Number(row.dataset.kernel));
    if (i === undefined) return;
    go(units[i][3], [i]);
    describe(i);
    document.getElementById("main").scrollIntoView();
  }));

  // A link may name a scope to show or a search to run: page.html#scope=a/b, #search=Softmax.
  const wanted = new URLSearchParams(location.hash.slice(1));
  if (scopes.has(wanted.get("scope") || "")) current = wanted.get("scope") || "";
  render();
  if (wanted.get("search")) {
    search.value = wanted.get("search");
    search.dispatchEvent(new KeyboardEvent("keydown", {key: "Enter"}));
  }
})();
