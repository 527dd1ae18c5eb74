"use strict";
const D = JSON.parse(document.getElementById("data").textContent);
const T = D.tokens.length, L = D.layers, H = D.heads, reach = D.reach;
const bytes = Uint8Array.from(atob(D.weights), c => c.charCodeAt(0));
const rowStart = [0], relStart = [0];
for (let t = 0; t < T; t++) {
  rowStart.push(rowStart[t] + t - reach[t] + 1);
  relStart.push(relStart[t] + t - reach[t]);
}
const R = rowStart[T];
const state = { layer: D.layer, head: D.head, query: D.query, pinned: false };  // the first view
const $ = id => document.getElementById(id);

function headWeight(l, h, t, j) {  // one head's stored weight, null where t cannot read j
  if (j > t || j < reach[t]) return null;
  return bytes[(l * H + h) * R + rowStart[t] + j - reach[t]] / D.weight_levels;
}
function weight(t, j) {  // what the selectors ask for: one head, a layer's mean, or every head's
  if (j > t || j < reach[t]) return null;
  const layers = state.layer === "mean" ? [...Array(L).keys()] : [state.layer];
  const heads = state.layer === "mean" || state.head === "mean" ? [...Array(H).keys()] : [state.head];
  let sum = 0;
  for (const l of layers) for (const h of heads) sum += headWeight(l, h, t, j);
  return sum / (layers.length * heads.length);
}
function relevance(t, j) {
  if (j >= t || j < reach[t]) return null;
  return D.relevance[relStart[t] + j - reach[t]];
}

function tokenRow(id) {
  const row = $(id), spans = [];
  D.tokens.forEach((label, i) => {
    const span = document.createElement("span");
    span.className = "tok"; span.textContent = label; span.dataset.pos = i;
    span.addEventListener("mouseenter", () => { if (!state.pinned) setQuery(i); });
    span.addEventListener("click", () => {
      state.pinned = !(state.pinned && state.query === i); setQuery(i);
    });
    row.appendChild(span); spans.push(span);
  });
  return spans;
}
const rows = { weights: tokenRow("weights-row"), relevance: tokenRow("relevance-row"), loss: tokenRow("loss-row") };

function fill(select, values, labels) {
  values.forEach((v, i) => { const o = document.createElement("option"); o.value = v; o.textContent = labels[i];
    select.appendChild(o); });
}
fill($("layer"), [...Array(L).keys(), "mean"], [...Array(L).keys()].map(String).concat(["every layer (mean)"]));
fill($("head"), [...Array(H).keys(), "mean"], [...Array(H).keys()].map(String).concat(["mean over heads"]));
$("layer").value = state.layer; $("head").value = state.head;
const parse = v => v === "mean" ? "mean" : Number(v);
$("layer").addEventListener("change", e => { state.layer = parse(e.target.value); render(); });
$("head").addEventListener("change", e => { state.head = parse(e.target.value); render(); });
document.addEventListener("keydown", e => {
  if (e.altKey || e.ctrlKey || e.metaKey) return;  // the browser's own (Alt+ArrowLeft: back)
  if (e.key === "ArrowRight" || e.key === "ArrowLeft") {
    e.preventDefault();  // a focused layer or head selector would also take the key and change
    state.pinned = true; setQuery(Math.min(T - 1, Math.max(0, state.query + (e.key === "ArrowRight" ? 1 : -1))));
  } else if (e.key === "Escape") { state.pinned = false; render(); }
});

function setQuery(q) { state.query = q; render(); }
function selectHead(l, h) {
  state.layer = l; state.head = h; $("layer").value = l; $("head").value = h; render();
}
const fmt = (v, d = 3) => v === null || v === undefined ? "" : v.toFixed(d);
const signed = v => (v >= 0 ? "+" : "") + v.toFixed(3);

function renderTokens() {
  const q = state.query;
  let largest = 0;
  for (let j = 0; j < q; j++) { const r = relevance(q, j); if (r !== null) largest = Math.max(largest, Math.abs(r)); }
  const losses = D.loss.filter(v => v !== null), worst = Math.max(...losses, 1e-9);
  for (let j = 0; j < T; j++) {
    const state_ = j > q ? "future" : j < reach[q] ? "far" : "";
    for (const name of ["weights", "relevance"]) {
      const span = rows[name][j];
      span.className = "tok" + (state_ ? " " + state_ : "") + (j === q ? " query" : "");
      span.style.background = "";
    }
    const w = weight(q, j), ws = rows.weights[j];
    ws.dataset.weight = fmt(w, 4);
    if (w !== null) { ws.style.background = `rgba(9, 105, 218, ${w.toFixed(3)})`; ws.style.color = w > 0.55 ? "#fff" : ""; }
    else ws.style.color = "";
    ws.title = w === null ? (j > q ? "future" : "out of reach: before the query's window") : `weight ${w.toFixed(3)}`;
    const r = relevance(q, j), rs = rows.relevance[j];
    rs.dataset.relevance = fmt(r, 3);
    rs.style.color = "";
    if (r !== null && largest > 0) {
      const a = Math.abs(r) / largest;
      rs.style.background = r >= 0 ? `rgba(207, 34, 46, ${a.toFixed(3)})` : `rgba(26, 127, 120, ${a.toFixed(3)})`;
      if (a > 0.55) rs.style.color = "#fff";
    }
    rs.title = r === null ? (j === q ? "the query itself" : "not measured") : `relevance ${signed(r)} nats`;
    const s = j > 0 ? D.loss[j - 1] : null, ls = rows.loss[j];
    ls.className = "tok" + (j === q ? " query" : "");
    ls.dataset.loss = fmt(s, 3);
    ls.style.background = s === null ? "" : `rgba(251, 143, 68, ${(s / worst).toFixed(3)})`;
    ls.title = s === null ? "the first token: nothing predicts it" : `surprise ${s.toFixed(3)} nats`;
  }
}

function renderInfo() {
  const q = state.query, tok = D.tokens;
  const what = state.layer === "mean" ? "every layer and head (mean)"
    : state.head === "mean" ? `layer ${state.layer}, mean over heads` : `layer ${state.layer}, head ${state.head}`;
  $("weights-title").textContent = what + "; colour intensity = weight";
  $("head").disabled = state.layer === "mean";
  const predicts = D.loss[q] === null ? "predicts nothing (the last token)"
    : `predicts ${tok[q + 1]} with loss ${D.loss[q].toFixed(3)} nats`;
  const pick = a => state.layer === "mean" ? a.mean
    : state.head === "mean" ? a.by_layer[state.layer] : a.by_head[state.layer][state.head];
  const shown = v => v === null ? "n/a" : v.toFixed(2);
  $("query-info").textContent = `query ${tok[q]} at ${q}${state.pinned ? " (pinned)" : ""} ${predicts}; ` +
    `reads ${reach[q]}..${q}. Weight vs relevance over the text (Spearman): ${shown(pick(D.agreement))}; ` +
    `vs |relevance|: ${shown(pick(D.agreement_by_size))}`;
}

function renderCurve() {
  const svg = $("curve"), W = 900, Hc = 170, pad = 8;
  const values = D.loss.map(v => v === null ? NaN : v), top = Math.max(1, Math.ceil(Math.max(...values.filter(isFinite))));
  const x = i => pad + (T > 1 ? i / (T - 1) : 0) * (W - 2 * pad), y = v => Hc - pad - v / top * (Hc - 2 * pad);
  let out = "";
  for (let v = 0; v <= top; v++) out += `<line x1="0" x2="${W}" y1="${y(v)}" y2="${y(v)}" stroke="#e5e7eb"/>`;
  const points = values.map((v, i) => isFinite(v) ? `${x(i).toFixed(1)},${y(v).toFixed(1)}` : null).filter(p => p);
  out += `<polyline fill="none" stroke="#0969da" stroke-width="1.5" points="${points.join(" ")}"/>`;
  out += `<text x="${W - pad}" y="${y(top) + 11}" text-anchor="end" font-size="11" fill="#6e7781">${top} nats</text>`;
  out += `<text x="${W - pad}" y="${y(0) - 3}" text-anchor="end" font-size="11" fill="#6e7781">0</text>`;
  const q = state.query;
  out += `<line x1="${x(q)}" x2="${x(q)}" y1="0" y2="${Hc}" stroke="#cf222e" stroke-width="1"/>`;
  if (isFinite(values[q])) out += `<circle cx="${x(q)}" cy="${y(values[q])}" r="3.5" fill="#cf222e"/>`;
  svg.innerHTML = out;
}

const canvases = [];
function buildGrid() {
  for (let l = 0; l < L; l++) {
    const row = document.createElement("div"); row.className = "layer";
    const label = document.createElement("span"); label.textContent = `layer ${l}`; row.appendChild(label);
    canvases.push([]);
    for (let h = 0; h < H; h++) {
      const c = document.createElement("canvas"); c.width = T; c.height = T; c.title = `layer ${l}, head ${h}`;
      c.dataset.layer = l; c.dataset.head = h;
      const ctx = c.getContext("2d"), img = ctx.createImageData(T, T);
      for (let t = 0; t < T; t++) for (let j = 0; j < T; j++) {
        const w = headWeight(l, h, t, j), k = 4 * (t * T + j);
        if (w === null) { img.data[k] = img.data[k + 1] = img.data[k + 2] = 221; }
        else { img.data[k] = 255 - 246 * w; img.data[k + 1] = 255 - 150 * w; img.data[k + 2] = 255 - 37 * w; }
        img.data[k + 3] = 255;
      }
      ctx.putImageData(img, 0, 0);
      c.addEventListener("click", () => selectHead(l, h));
      row.appendChild(c); canvases[l].push(c);
    }
    $("grid").appendChild(row);
  }
}

function buildAblation() {
  const table = $("ablation"), head = document.createElement("tr");
  head.innerHTML = "<th>layer</th>" + [...Array(H).keys()].map(h => `<th>head ${h}</th>`).join("");
  table.appendChild(head);
  const largest = Math.max(...D.head_ablation.flat().map(Math.abs), 1e-9);
  D.head_ablation.forEach((values, l) => {
    const tr = document.createElement("tr"), th = document.createElement("th");
    th.textContent = l; tr.appendChild(th);
    values.forEach((v, h) => {
      const td = document.createElement("td"), a = Math.abs(v) / largest;
      td.textContent = signed(v); td.dataset.layer = l; td.dataset.head = h; td.dataset.rise = v;
      td.style.background = v >= 0 ? `rgba(207, 34, 46, ${a.toFixed(3)})` : `rgba(26, 127, 120, ${a.toFixed(3)})`;
      if (a > 0.55) td.style.color = "#fff";
      td.addEventListener("click", () => selectHead(l, h));
      tr.appendChild(td);
    });
    table.appendChild(tr);
  });
  const a = D.agreement, b = D.agreement_by_size, shown = v => v === null ? "n/a" : v.toFixed(2);
  const byLayer = x => x.by_layer.map((v, l) => `${l}: ${shown(v)}`).join(", ");
  $("agreement").textContent = `Mean loss ${D.mean_loss.toFixed(3)} nats over ${T - 1} predictions. ` +
    `Rank correlation (Spearman) of weight with relevance over the text's ${a.pairs} (query, earlier key) pairs: ` +
    `${shown(a.mean)} for the mean over every head; by layer ${byLayer(a)}. ` +
    `With |relevance| (how much a key matters, either way): ${shown(b.mean)}; by layer ${byLayer(b)}.`;
}

function renderSelection() {
  canvases.forEach((row, l) => row.forEach((c, h) =>
    c.classList.toggle("selected", l === state.layer && (h === state.head || state.head === "mean"))));
  document.querySelectorAll("#ablation td").forEach(td => td.classList.toggle("selected",
    Number(td.dataset.layer) === state.layer && Number(td.dataset.head) === state.head));
}

function render() { renderTokens(); renderInfo(); renderCurve(); renderSelection(); }

$("source").textContent = D.source;
const windows = reach.some(r => r > 0);
$("note").textContent = `${T} tokens, ${L} layers x ${H} heads, context ${D.context}. ` + (windows
  ? `The text is longer than the context: it is read in windows of ${D.context} tokens, ${Math.max(1, Math.floor(D.context / 2))} apart; each token is measured in the first window holding it, and tokens before that window's start are out of its reach (hatched).`
  : "The whole text fits in the context.") + " Hover a token to make it the query, click to pin it.";
buildGrid(); buildAblation(); render();
