/* horizonrl run viewer: steps -> groups -> rollouts -> session DAG -> turns with per-token credit.
 *
 * Data: window.HZ_MODE is "file" (the index and every step are JSON script blocks in the page,
 * parsed only when opened) or "serve" (fetched from api/index and api/step/KEY). Payload format:
 * horizonrl/viz/data.py. Everything is rendered on demand: the rollout list of the open step, the
 * detail of the open rollout, a session's tokens when the session is expanded.
 */
(function () {
  "use strict";
  const MODE = window.HZ_MODE || "file";
  const POS = [33, 102, 172], NEG = [178, 24, 43];
  const KINDS = ["normal", "compaction", "subagent", "selection", "summary"];
  const KIND_COLOURS = { normal: "#e6eef8", compaction: "#fde8c4", subagent: "#d9f0dd", selection: "#ecdff6",
    summary: "#f6dddd" };
  const TOKEN_BUDGET = 20000;  // sessions beyond this many tokens start collapsed
  const S = { index: null, cache: {}, vocab: {}, hasVocab: false, step: null, ro: null, all: false,
    f: { success: "any", rmin: "", rmax: "", sign: "any", end: "any", q: "" } };

  // ------------------------------------------------------------------ helpers
  function h(tag, attrs, ...kids) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") el.className = v;
      else if (k === "text") el.textContent = v;
      else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else el.setAttribute(k, v === true ? "" : v);
    }
    for (const c of kids.flat()) if (c !== null && c !== undefined && c !== false)
      el.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
    return el;
  }
  const SVGNS = "http://www.w3.org/2000/svg";
  function s(tag, attrs, ...kids) {
    const el = document.createElementNS(SVGNS, tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined) continue;
      if (k === "text") el.textContent = v;
      else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else el.setAttribute(k, v);
    }
    for (const c of kids.flat()) if (c) el.appendChild(c);
    return el;
  }
  function fmt(v, d) {
    if (v === null || v === undefined) return "–";
    if (typeof v === "number") {
      if (Number.isInteger(v)) return String(v);
      const a = Math.abs(v);
      return a !== 0 && (a < 1e-3 || a >= 1e5) ? v.toExponential(2) : v.toFixed(d === undefined ? 3 : d);
    }
    if (typeof v === "boolean") return v ? "yes" : "no";
    if (Array.isArray(v)) return v.length > 12 ? `[${v.slice(0, 12).map((x) => fmt(x)).join(", ")}, …]`
      : `[${v.map((x) => fmt(x)).join(", ")}]`;
    if (typeof v === "object") return clip(JSON.stringify(v), 160);
    return clip(String(v), 160);
  }
  function chips(obj, cls, skip) {
    if (!obj) return null;
    const out = Object.entries(obj).filter(([k]) => !(skip || []).includes(k))
      .map(([k, v]) => h("span", { class: "chip " + (cls || ""), title: `${k} = ${JSON.stringify(v)}` },
        h("b", { text: k }), fmt(v)));
    return out.length ? h("div", { class: "chips" }, out) : null;
  }
  function advOf(enc, n) {
    if (enc === null || enc === undefined) return null;
    if (typeof enc === "number") return new Array(n).fill(enc);
    const out = [];
    for (const [v, c] of enc) for (let i = 0; i < c; i++) out.push(v);
    return out;
  }
  function colour(a, M) {
    const t = Math.max(-1, Math.min(1, M > 0 ? a / M : 0));
    const c = t >= 0 ? POS : NEG, k = Math.abs(t) * 0.9;
    const m = (i) => Math.round(255 + (c[i] - 255) * k);
    return `rgb(${m(0)}, ${m(1)}, ${m(2)})`;
  }
  function textColour(a, M) { return M > 0 && Math.abs(a / M) > 0.6 ? "#fff" : null; }
  function piece(id) {
    const p = S.vocab[id];
    if (p === undefined) return `⟨${id}⟩`;
    return p.replace(/[\u0000-\u0008\u000b-\u001f\u007f]/g, (ch) => String.fromCharCode(0x2400 + (ch.charCodeAt(0) & 0x1f)));
  }
  function clip(x, n) { return x.length > n ? x.slice(0, n - 1) + "…" : x; }

  // ------------------------------------------------------------------ data
  async function loadIndex() {
    if (MODE === "serve") return (await fetch("api/index")).json();
    return JSON.parse(document.getElementById("hz-index").textContent);
  }
  async function loadStep(key) {
    if (S.cache[key]) return S.cache[key];
    let st;
    if (MODE === "serve") {
      const r = await fetch("api/step/" + encodeURIComponent(key));
      st = await r.json();
    } else {
      const el = document.getElementById("hz-step-" + key);
      st = el ? JSON.parse(el.textContent) : { key, R: [], P: [], problems: [`no data for ${key}`] };
    }
    if (st.V) { Object.assign(S.vocab, st.V); S.hasVocab = true; }
    let M = 0;
    st.R.forEach((r, i) => {
      r.i = i;
      for (const sg of r.S) for (const t of sg.T) {
        const a = t.a;
        if (typeof a === "number") M = Math.max(M, Math.abs(a));
        else if (Array.isArray(a)) for (const [v] of a) M = Math.max(M, Math.abs(v));
      }
    });
    st.M = M;
    S.cache[key] = st;
    if (st.problems && st.problems.length) addProblems(st.problems);
    return st;
  }
  function searchText(r) {
    if (r._t === undefined) {
      const parts = [r.u, r.task, r.fa || "", r.end];
      for (const sg of r.S) for (const t of sg.T) parts.push(t.txt || "", t.obs || "");
      r._t = parts.join("\n").toLowerCase();
    }
    return r._t;
  }
  function passes(r) {
    const f = S.f;
    if (f.success === "yes" && !r.ok) return false;
    if (f.success === "no" && r.ok) return false;
    if (f.rmin !== "" && !(r.R >= parseFloat(f.rmin))) return false;
    if (f.rmax !== "" && !(r.R <= parseFloat(f.rmax))) return false;
    if (f.sign !== "any" && (f.sign === "none" ? r.sg !== null : r.sg !== f.sign)) return false;
    if (f.end !== "any" && r.end !== f.end) return false;
    if (f.q && !searchText(r).includes(f.q.toLowerCase())) return false;
    return true;
  }

  // ------------------------------------------------------------------ problems
  const seenProblems = new Set();
  function addProblems(list) {
    const box = document.getElementById("hz-problems");
    for (const p of list) {
      if (seenProblems.has(p)) continue;
      seenProblems.add(p);
      box.appendChild(h("div", { class: "problem", text: "⚠ " + p }));
    }
  }

  // ------------------------------------------------------------------ steps pane
  function stepLabel(e) {
    const m = e.metrics || {};
    const bits = [];
    if (m["reward/mean"] !== undefined) bits.push("R̄ " + fmt(m["reward/mean"], 2));
    if (m["success/rate"] !== undefined) bits.push("✓ " + fmt(m["success/rate"], 2));
    if (m["eval/pass@1"] !== undefined && m["eval/pass@1"] !== null) bits.push("p@1 " + fmt(m["eval/pass@1"], 2));
    return bits.join(" · ");
  }
  function renderSteps() {
    const nav = document.getElementById("hz-steps");
    nav.replaceChildren();
    const groups = { step: [], trunks: [], chains: [] };
    for (const e of S.index.steps) groups[e.kind].push(e);
    const title = { step: "steps", trunks: "RTPO trunks", chains: "SeeUPO chains" };
    for (const kind of ["step", "trunks", "chains"]) {
      if (!groups[kind].length) continue;
      nav.appendChild(h("h3", { text: `${title[kind]} (${groups[kind].length})` }));
      for (const e of groups[kind]) {
        nav.appendChild(h("div", { class: "step" + (S.step === e.key ? " sel" : ""), "data-key": e.key,
          onclick: () => go(e.key, null) }, `${kind === "step" ? "step" : kind} ${e.n}`,
          h("small", { text: stepLabel(e) || `${Math.round(e.bytes / 1024)} KiB` })));
      }
    }
    if (!S.index.steps.length) nav.appendChild(h("div", { class: "empty", text: "no rollouts/*.jsonl yet" }));
  }

  // ------------------------------------------------------------------ list pane
  function filterBar(st) {
    const ends = new Set(["any"]);
    if (st) for (const r of st.R) ends.add(r.end);
    const sel = (name, opts) => h("select", { "data-filter": name, onchange: (ev) => { S.f[name] = ev.target.value; renderList(); } },
      opts.map(([v, t]) => h("option", { value: v, selected: S.f[name] === v, text: t })));
    const num = (name, ph) => h("input", { type: "number", step: "any", placeholder: ph, value: S.f[name], "data-filter": name,
      onchange: (ev) => { S.f[name] = ev.target.value; renderList(); } });
    return h("div", { class: "filters" },
      h("label", { text: "success" }), sel("success", [["any", "any"], ["yes", "✓"], ["no", "✗"]]),
      h("label", { text: "reward" }), num("rmin", "min"), num("rmax", "max"),
      h("label", { text: "sign" }), sel("sign", [["any", "any"], ["+", "+"], ["-", "−"], ["0", "0"], ["±", "±"], ["none", "untrained"]]),
      h("label", { text: "end" }), sel("end", [...ends].map((e) => [e, e])),
      h("input", { type: "search", placeholder: "search text…", value: S.f.q, "data-filter": "q",
        onkeydown: (ev) => { if (ev.key === "Enter") { clearTimeout(S.qTimer); S.f.q = ev.target.value; renderList(); } },
        oninput: (ev) => { clearTimeout(S.qTimer); const v = ev.target.value; S.qTimer = setTimeout(() => { if (S.f.q !== v) { S.f.q = v; renderList(); } }, 400); },
        onsearch: (ev) => { S.f.q = ev.target.value; renderList(); } }),
      h("label", {}, h("input", { type: "checkbox", checked: S.all, "data-filter": "all",
        onchange: (ev) => { S.all = ev.target.checked; renderList(); } }), " all steps"));
  }
  function roRow(key, r) {
    const kinds = h("span", { class: "kinds", title: r.S.map((sg) => sg.k).join(", ") },
      r.S.map((sg) => h("span", { style: `background:${KIND_COLOURS[sg.k] || "#fff"}` })));
    const signCls = r.sg === "+" ? "sign-p" : r.sg === "-" ? "sign-n" : r.sg === "±" ? "sign-m" : "";
    const cur = S.step === key && S.ro === r.i;
    return h("div", { class: "ro" + (cur ? " sel" : ""), "data-uid": r.u, "data-i": r.i,
      onclick: () => go(key, r.i) },
      h("span", { class: "uid mono", title: r.u, text: r.u }),
      h("span", { class: "mono", text: fmt(r.R, 2) }),
      h("span", { class: r.ok ? "ok" : "fail", text: r.ok ? "✓" : "✗" }),
      h("span", { class: "end", text: r.end }),
      kinds,
      h("span", { class: "sign " + signCls, title: "sign of the trained tokens' advantages", text: r.sg === null ? "·" : r.sg }),
      h("span", { class: "mono", title: "mean advantage over trained tokens", text: r.am === null ? "" : fmt(r.am, 2) }));
  }
  function groupBlocks(key, rows) {
    const byGroup = new Map();
    for (const r of rows) { if (!byGroup.has(r.g)) byGroup.set(r.g, []); byGroup.get(r.g).push(r); }
    const out = [];
    for (const [g, rs] of byGroup) {
      const mean = rs.reduce((a, r) => a + (r.R || 0), 0) / rs.length;
      out.push(h("div", { class: "group", "data-group": g },
        h("div", { class: "gh" }, `group ${g} · task ${rs[0].task} · ${rs.length} shown · R̄ ${fmt(mean, 2)}`),
        rs.map((r) => roRow(key, r))));
    }
    return out;
  }
  function stepInfo(key) {
    const e = S.index.steps.find((x) => x.key === key);
    if (!e || !e.metrics || !Object.keys(e.metrics).length) return null;
    const rows = Object.entries(e.metrics).map(([k, v]) => h("tr", {}, h("td", { text: k }), h("td", { class: "mono", text: fmt(v, 4) })));
    return h("details", { class: "stepinfo" }, h("summary", { text: `step ${e.n} metrics (${rows.length})` }),
      h("table", { class: "kv" }, rows));
  }
  let listToken = 0;
  async function renderList() {
    const pane = document.getElementById("hz-list");
    const my = ++listToken;
    if (!S.step) { pane.replaceChildren(h("div", { class: "empty", text: "pick a step" })); return; }
    const st = await loadStep(S.step);
    const body = [];
    if (S.all) {
      let shown = 0;
      for (const e of S.index.steps) {
        const other = await loadStep(e.key);
        if (my !== listToken) return;
        const rows = other.R.filter(passes);
        if (!rows.length) continue;
        const take = rows.slice(0, Math.max(0, 300 - shown));
        shown += take.length;
        body.push(h("h4", { text: `${e.kind} ${e.n}: ${rows.length} match` }), groupBlocks(e.key, take));
        if (shown >= 300) { body.push(h("div", { class: "empty", text: "first 300 matches shown" })); break; }
      }
    } else {
      const rows = st.R.filter(passes);
      body.push(h("div", { class: "count", text: `${rows.length} of ${st.R.length} rollouts` }), groupBlocks(S.step, rows));
    }
    if (my !== listToken) return;
    const active = document.activeElement, focus = active && active.dataset ? active.dataset.filter : undefined;
    const open = pane.querySelector("details.stepinfo[open]") !== null;
    pane.replaceChildren(filterBar(st), stepInfo(S.step) || "", ...body.flat());
    if (open && pane.querySelector("details.stepinfo")) pane.querySelector("details.stepinfo").open = true;
    if (focus) {  // keep typing in the search box across re-renders
      const el = pane.querySelector(`[data-filter="${focus}"]`);
      if (el) { el.focus(); if (el.type === "search") el.setSelectionRange(el.value.length, el.value.length); }
    }
  }

  // ------------------------------------------------------------------ DAG
  function treeLayout(nodes) {
    const byId = new Map(nodes.map((n) => [n.id, n]));
    const kids = new Map(nodes.map((n) => [n.id, []]));
    const roots = [];
    for (const n of nodes) {
      if (n.parent !== null && n.parent !== undefined && byId.has(n.parent) && n.parent !== n.id) kids.get(n.parent).push(n);
      else roots.push(n);
    }
    let slot = 0, depthMax = 0;
    const seen = new Set();
    function place(n, d) {
      if (seen.has(n.id)) return;
      seen.add(n.id);
      const ks = kids.get(n.id).filter((k) => !seen.has(k.id));
      n.y = d; depthMax = Math.max(depthMax, d);
      if (!ks.length) { n.x = slot++; return; }
      ks.forEach((k) => place(k, d + 1));
      const placed = ks.filter((k) => k.x !== undefined);
      n.x = placed.length ? (placed[0].x + placed[placed.length - 1].x) / 2 : slot++;
    }
    roots.forEach((r) => place(r, 0));
    for (const n of nodes) if (n.x === undefined) place(n, 0);  // cycles: lay out what is left
    return { cols: Math.max(slot, 1), rows: depthMax + 1 };
  }
  function drawGraph(title, nodes, edges, onNode) {
    const W = 168, H = 40, GX = 186, GY = 66, PAD = 12;
    const lay = treeLayout(nodes);
    const width = lay.cols * GX + PAD * 2 - (GX - W), height = lay.rows * GY + PAD * 2 - (GY - H);
    const px = (n) => PAD + n.x * GX, py = (n) => PAD + n.y * GY;
    const byId = new Map(nodes.map((n) => [n.id, n]));
    const svg = s("svg", { xmlns: SVGNS, width, height, viewBox: `0 0 ${width} ${height}`, role: "img" });
    for (const e of edges) {
      const a = byId.get(e.from), b = byId.get(e.to);
      if (!a || !b) continue;
      const x1 = px(a) + W / 2, y1 = py(a) + H, x2 = px(b) + W / 2, y2 = py(b);
      const my = (y1 + y2) / 2;
      svg.appendChild(s("path", { class: "edge " + (e.cls || ""), d: `M${x1},${y1} C${x1},${my} ${x2},${my} ${x2},${y2}`,
        "data-from": e.from, "data-to": e.to, "data-kind": e.cls || "parent" }));
      if (e.label) svg.appendChild(s("text", { class: "elabel", x: (x1 + x2) / 2 + 4, y: my - 2, text: e.label }));
    }
    for (const n of nodes) {
      const g = s("g", { class: `node n-${n.cls}` + (n.cur ? " cur" : ""), transform: `translate(${px(n)},${py(n)})`,
        "data-node": n.id, "data-kind": n.cls, "data-seg": n.seg, onclick: () => onNode && onNode(n) },
        s("title", { text: n.title || n.label }),
        s("rect", { width: W, height: H, rx: 4 }),
        s("text", { x: 6, y: 15, text: clip(n.label, 25) }),
        s("text", { x: 6, y: 31, text: clip(n.sub || "", 27) }));
      if (n.adv !== null && n.adv !== undefined) {
        g.appendChild(s("rect", { class: "advbar", x: W - 10, y: 5, width: 6, height: H - 10, fill: colour(n.adv, n.M),
          stroke: "#999", "data-adv": n.adv }));
      }
      svg.appendChild(g);
    }
    return h("div", { class: "dag" }, h("h4", { text: title }), svg);
  }
  function segAdvMean(sg) {
    let tot = 0, cnt = 0;
    for (const t of sg.T) {
      const a = advOf(t.a, t.r.length);
      if (a) for (const v of a) { tot += v; cnt++; }
    }
    return cnt ? tot / cnt : null;
  }
  function sessionDag(r, M) {
    const nodes = r.S.map((sg, i) => {
      const mean = segAdvMean(sg);
      const ntok = sg.T.reduce((a, t) => a + t.r.length, 0);
      return { id: "s" + i, seg: i, parent: sg.p === null || sg.p === undefined ? null : "s" + sg.p, cls: sg.k,
        label: `S${i} ${sg.k}`, sub: `${sg.T.length} turn${sg.T.length === 1 ? "" : "s"} · ${ntok} tok` + (mean === null ? "" : ` · Ā ${fmt(mean, 2)}`),
        title: `session ${i} (${sg.k})` + (sg.info ? "\n" + JSON.stringify(sg.info) : "") + (sg.side ? "\nside: " + JSON.stringify(sg.side) : ""),
        adv: mean, M };
    });
    const edges = [];
    r.S.forEach((sg, i) => {
      if (sg.p === null || sg.p === undefined) return;
      const fork = sg.k === "subagent";
      const label = sg.k === "compaction" ? `compact #${sg.f ?? "?"}` : fork ? `fork #${sg.f ?? "?"}`
        : r.S[sg.p] && r.S[sg.p].k === "compaction" ? "continue" : sg.f !== null && sg.f !== undefined ? `#${sg.f}` : "";
      edges.push({ from: "s" + sg.p, to: "s" + i, cls: fork ? "fork" : "parent", label });
    });
    return drawGraph("session DAG", nodes, edges, (n) => openSession(n.seg));
  }
  function rtpoTree(key, st, r) {
    const [trunk, k] = r.br;
    const tr = (st.trunks || {})[trunk];
    const K = tr ? tr.turns.length : k + 1;
    const nodes = [{ id: "task", parent: null, cls: "task", label: `task ${r.task}`, sub: "S_0" }];
    const edges = [];
    for (let t = 0; t < K; t++) {
      const parent = t === 0 ? "task" : "t" + (t - 1);
      nodes.push({ id: "t" + t, parent, cls: "trunk", label: `trunk turn ${t}`, sub: tr && t === K - 1 ? `R ${fmt(tr.R, 2)}` : "",
        title: tr ? tr.turns[t] : `trunk ${trunk}` });
      edges.push({ from: parent, to: "t" + t, cls: "parent" });
    }
    const at = k === 0 ? "task" : "t" + (k - 1);
    const sibs = st.R.filter((x) => x.br && x.br[0] === trunk && x.br[1] === k);
    sibs.forEach((x, j) => {
      const side = x.side || {};
      nodes.push({ id: "b" + x.i, parent: at, cls: "sibling", cur: x.i === r.i, label: `sibling ${side.sibling ?? j} (k=${k})`,
        sub: `R ${fmt(x.R, 2)}` + (x.am === null ? "" : ` · A ${fmt(x.am, 2)}`), ri: x.i, adv: x.am, M: st.M,
        title: x.u });
      edges.push({ from: at, to: "b" + x.i, cls: "fork", label: j === 0 ? `fork at k=${k}` : "" });
    });
    return drawGraph(`RTPO tree: trunk ${trunk}${tr ? "" : " (trunk file not found)"}`, nodes, edges,
      (n) => { if (n.ri !== undefined && n.ri !== r.i) go(key, n.ri); });
  }

  // ------------------------------------------------------------------ tokens
  function tokenSpans(t, adv, M, mask, gturnOf) {
    const n = t.r.length;
    const out = [];
    const spans = (t.sp || []).slice().sort((a, b) => a[1] - b[1] || b[2] - a[2]);
    const wrap = new Array(n).fill(null);
    const extra = [];
    for (const sp of spans) {
      const [, a, b] = sp;
      let free = a < b && b <= n;
      for (let j = a; free && j < b; j++) if (wrap[j]) free = false;
      if (free) for (let j = a; j < b; j++) wrap[j] = sp; else extra.push(sp);
    }
    const tok = (j) => {
      const a = adv ? adv[j] : null;
      const cls = "tk" + (a === null ? " untrained" : "") + (mask && mask[j] === "0" ? " mask0" : "");
      const style = a === null ? null : `background:${colour(a, M)}` + (textColour(a, M) ? `;color:${textColour(a, M)}` : "");
      return h("span", { class: cls, style, "data-i": t.r[j], "data-a": a === null ? null : String(a), "data-j": j,
        "data-mask": mask ? mask[j] : null,
        title: `token ${j} id ${t.r[j]} · adv ${a === null ? "not trained" : fmt(a, 4)} · logp ${t.lp[j] === undefined ? "?" : fmt(t.lp[j], 3)}` },
        S.hasVocab ? piece(t.r[j]) : `⟨${t.r[j]}⟩`);
    };
    let j = 0;
    while (j < n) {
      const sp = wrap[j];
      if (!sp) { out.push(tok(j)); j++; continue; }
      const [label, a, b, src] = sp;
      const inner = [h("span", { class: "slabel", text: label })];
      for (let q = a; q < b; q++) inner.push(tok(q));
      if (src !== null && src !== undefined) {
        inner.push(h("a", { class: "src", "data-src": src, title: `source turn ${src}`, onclick: (ev) => { ev.stopPropagation(); flashTurn(gturnOf(src)); } }, `→t${src}`));
      }
      out.push(h("span", { class: "spanwrap sp-" + label, "data-label": label, "data-start": a, "data-end": b,
        "data-src": src === null || src === undefined ? null : src }, inner));
      j = b;
    }
    return { nodes: out, extra };
  }
  function promptBlock(st, t, isFirst) {
    if (t.pi !== undefined) {
      const ids = st.P[t.pi] || [];
      return h("details", { class: "prompt", "data-prompt": "full" },
        h("summary", { text: `${isFirst ? "context" : "new context (row break)"} · ${ids.length} prompt tokens` }),
        h("div", { class: "tok env" }, S.hasVocab ? ids.map(piece).join("") : ids.join(" ")));
    }
    if (!t.p || !t.p.length) return null;
    const ids = t.p.length > 600 ? t.p.slice(0, 600) : t.p;
    return h("div", { class: "tok env", "data-prompt": "env", title: `${t.p.length} environment tokens (masked: not trained)` },
      S.hasVocab ? ids.map(piece).join("") : ids.join(" "), t.p.length > 600 ? ` … (+${t.p.length - 600} tokens)` : "");
  }
  function turnBlock(st, r, si, ti, M, gturn, gturnOf) {
    const sg = r.S[si], t = sg.T[ti];
    const adv = advOf(t.a, t.r.length);
    const mask = t.side && typeof t.side.mask === "string" ? t.side.mask : null;
    const prevRow = ti > 0 ? sg.T[ti - 1].row : undefined;
    const head = [h("b", { text: `turn ${ti}` }), h("span", { text: `#${gturn} in rollout · ${t.r.length} tokens` })];
    if (t.row !== undefined && t.row !== null && t.row !== prevRow) head.push(h("span", { class: "rowmark", "data-row": t.row, text: `row ${t.row}` }));
    if (t.row === null) head.push(h("span", { class: "chip", text: "not trained" }));
    if (adv && adv.length) {
      const lo = Math.min(...adv), hi = Math.max(...adv);
      head.push(h("span", { class: "chip", text: lo === hi ? `A ${fmt(lo, 4)}` : `A ${fmt(lo, 3)} … ${fmt(hi, 3)}` }));
    }
    if (t.rw) head.push(h("span", { class: "chip", text: `reward ${fmt(t.rw)}` }));
    if (t.tr) head.push(h("span", { class: "chip", text: "truncated" }));
    if (t.inv) head.push(h("span", { class: "chip", text: "invalid" }));
    if (t.tc) head.push(h("span", { class: "chip", text: `${t.tc} tool call${t.tc > 1 ? "s" : ""}` }));
    const { nodes, extra } = tokenSpans(t, adv, M, mask, gturnOf);
    const sideChips = t.side ? chips(t.side, "side", ["mask"]) : null;
    const next = sg.T[ti + 1];
    const showObs = t.obs !== undefined && !(next && next.p !== undefined);
    return h("div", { class: "turn", id: `turn-${r.i}-${gturn}`, "data-seg": si, "data-turn": ti, "data-gturn": gturn,
      "data-src-turn": t.info && t.info.source_turn !== undefined ? t.info.source_turn : null },
      h("div", { class: "th" }, head),
      sideChips, t.info ? chips(t.info) : null,
      extra.length ? h("div", { class: "chips" }, extra.map((sp) => h("span", { class: "chip", text: `${sp[0]} [${sp[1]}, ${sp[2]})` + (sp[3] !== null && sp[3] !== undefined ? ` ← t${sp[3]}` : "") }))) : null,
      promptBlock(st, t, ti === 0),
      h("div", { class: "tok response" }, nodes),
      showObs ? h("div", { class: "obs" }, h("b", { text: "observation: " }), t.obs) : null);
  }
  function sessionBlock(st, r, si, M, gstart, gturnOf, collapsed) {
    const sg = r.S[si];
    const ntok = sg.T.reduce((a, t) => a + t.r.length, 0);
    const body = h("div", { class: "sb" });
    const el = h("div", { class: `session k-${sg.k}` + (collapsed ? " collapsed" : ""), id: `seg-${r.i}-${si}`, "data-seg": si, "data-kind": sg.k },
      h("div", { class: "sh", onclick: () => toggle() },
        h("b", { text: `S${si} · ${sg.k}` }),
        ` · ${sg.T.length} turns · ${ntok} tokens`,
        sg.p !== null && sg.p !== undefined ? ` · parent S${sg.p}` : "",
        sg.f !== null && sg.f !== undefined ? ` · ${sg.k === "subagent" ? "fork" : "index"} #${sg.f}` : ""),
      body);
    let rendered = false;
    function fill() {
      if (rendered) return;
      rendered = true;
      body.append(chips(sg.side, "side") || "", chips(sg.info) || "");
      sg.T.forEach((_, ti) => body.appendChild(turnBlock(st, r, si, ti, M, gstart + ti, gturnOf)));
    }
    function toggle() { el.classList.toggle("collapsed"); if (!el.classList.contains("collapsed")) fill(); }
    el.open = () => { el.classList.remove("collapsed"); fill(); };
    if (!collapsed) fill();
    return el;
  }
  function legend(M) {
    return h("div", { class: "legend", "data-scale": M },
      h("span", { text: "advantage" }), h("span", { class: "mono", text: fmt(-M, 3) }), h("span", { class: "bar" }),
      h("span", { class: "mono", text: "+" + fmt(M, 3) }),
      h("span", { class: "sw", style: "background:repeating-linear-gradient(45deg,#f3f3f3,#f3f3f3 3px,#e6e6e6 3px,#e6e6e6 6px)" }), " not trained",
      h("span", { class: "sw env" }), " environment tokens (masked)");
  }
  let openSession = () => {};
  function flashTurn(g) {
    const el = document.getElementById(`turn-${S.ro}-${g}`);
    if (!el) return;
    const seg = el.closest(".session");
    if (seg && seg.open) seg.open();
    el.scrollIntoView({ block: "center" });
    el.classList.add("flash");
    setTimeout(() => el.classList.remove("flash"), 1200);
  }
  async function renderDetail() {
    const pane = document.getElementById("hz-detail");
    if (!S.step || S.ro === null || S.ro === undefined) {
      pane.replaceChildren(h("div", { class: "empty", text: "pick a rollout" }));
      return;
    }
    const st = await loadStep(S.step);
    const r = st.R[S.ro];
    if (!r) { pane.replaceChildren(h("div", { class: "empty", text: `no rollout ${S.ro} in ${S.step}` })); return; }
    const M = st.M;
    const head = h("div", { class: "rhead" },
      h("h2", { class: "mono", text: r.u }),
      h("div", { class: "chips" },
        h("span", { class: "chip" }, h("b", { text: "task" }), String(r.task)),
        h("span", { class: "chip" }, h("b", { text: "reward" }), fmt(r.R)),
        h("span", { class: "chip " + (r.ok ? "ok" : "fail") }, r.ok ? "success" : "failure"),
        h("span", { class: "chip" }, h("b", { text: "end" }), r.end),
        h("span", { class: "chip" }, h("b", { text: "estimator" }), r.est || S.index.estimator || "–"),
        h("span", { class: "chip" }, h("b", { text: "sessions" }), String(r.S.length)),
        r.fa !== null && r.fa !== undefined ? h("span", { class: "chip" }, h("b", { text: "answer" }), String(r.fa)) : null),
      r.side ? chips(r.side, "side") : null,
      r.env ? chips(r.env) : null,
      r.sg === null && !r.S.some((sg) => sg.T.some((t) => "a" in t))
        ? h("div", { class: "chips" }, h("span", { class: "chip", text: "no credit recorded for this rollout (a run from before the credit log, or train.save_credit=false): tokens are not coloured" }))
        : null);
    // Global turn numbering (rollout order) and ECHO's record index -> turn.
    const gstart = [], bySrc = new Map();
    let g = 0;
    r.S.forEach((sg, si) => { gstart.push(g); sg.T.forEach((t) => { if (t.info && t.info.source_turn !== undefined) bySrc.set(t.info.source_turn, g); g++; }); });
    const gturnOf = (src) => (bySrc.has(src) ? bySrc.get(src) : src);
    const total = r.S.reduce((a, sg) => a + sg.T.reduce((b, t) => b + t.r.length, 0), 0);
    let budget = 0;
    const sessions = r.S.map((sg, si) => {
      const n = sg.T.reduce((b, t) => b + t.r.length, 0);
      const collapsed = total > TOKEN_BUDGET && budget > 0 && budget + n > TOKEN_BUDGET;
      budget += n;
      return sessionBlock(st, r, si, M, gstart[si], gturnOf, collapsed);
    });
    openSession = (si) => { const el = sessions[si]; if (el) { el.open(); el.scrollIntoView({ block: "start" }); } };
    const parts = [head, legend(M)];
    if (r.br) parts.push(rtpoTree(S.step, st, r));
    parts.push(sessionDag(r, M), ...sessions);
    pane.replaceChildren(...parts);
    pane.scrollTop = 0;
  }

  // ------------------------------------------------------------------ navigation
  function go(key, ro) {
    const hash = ro === null || ro === undefined ? `#/${key}` : `#/${key}/${ro}`;
    if (location.hash === hash) route(); else location.hash = hash;
  }
  async function route() {
    const m = /^#\/([^/]+)(?:\/(\d+))?/.exec(location.hash);
    const key = m ? decodeURIComponent(m[1]) : (S.index.steps[0] || {}).key;
    const ro = m && m[2] !== undefined ? parseInt(m[2], 10) : null;
    const stepChanged = key !== S.step;
    S.step = key || null;
    S.ro = ro;
    document.querySelectorAll("#hz-steps .step").forEach((el) => el.classList.toggle("sel", el.dataset.key === S.step));
    if (stepChanged || S.all) await renderList();
    else document.querySelectorAll("#hz-list .ro").forEach((el) => el.classList.toggle("sel", +el.dataset.i === S.ro));
    await renderDetail();
    document.body.dataset.ready = "1";
    if (window.HZ_READY === undefined) window.HZ_READY = performance.now();
  }
  async function start() {
    S.index = await loadIndex();
    document.getElementById("hz-name").textContent = S.index.name;
    document.getElementById("hz-meta").textContent = `${S.index.trainer || "group"} trainer · estimator ${S.index.estimator || "?"} · ${S.index.steps.length} rollout files · ${MODE}`;
    addProblems(S.index.problems || []);
    renderSteps();
    window.addEventListener("hashchange", route);
    await route();
  }
  window.HZ = { state: S, go, reload: async () => { S.index = await loadIndex(); renderSteps(); } };
  start().catch((e) => { addProblems([`viewer error: ${e}`]); document.body.dataset.ready = "error"; });
})();
