"""The explorer: one self-contained HTML page of a text's attention weights and relevance.

`explorer_html(rel)` turns a `relevance.Relevance` into a page that opens from disk with no
network: the CSS, the script and the data are inline, and nothing is fetched. It shows

- the tokens three times: coloured by the weights the query token puts on each earlier
  token (a layer and head chosen with the selectors, or the mean over heads, or over
  everything), by each earlier token's relevance to the query's prediction (token ablation),
  and by each token's own surprise (the loss of predicting it). Hovering a token makes it
  the query; a click pins it (a second click or Escape unpins; arrow keys move it);
- the loss along the text, the query marked;
- every head's (T, T) weights as a small heatmap, a row per layer; a click selects it;
- head ablation as a layer x head grid; a click selects that head too.

The data is stored once and compact: weights as whole 255ths (within 0.002 of the model's),
one byte each, base64, only the keys each query can read (`Relevance.reach`..query);
relevance and losses rounded to 0.001 nats. The script rebuilds everything else. Every
token span carries `data-pos` and, in the weights and relevance rows, `data-weight` /
`data-relevance`: the numbers its colour shows, which the browser test reads back.
"""

from __future__ import annotations

import base64
import html
import json
import math
import re
from pathlib import Path
from typing import Optional

import numpy as np

from tinyattn.analysis.ablation import Relevance, agreement
from tinyattn.errors import TinyattnError

WEIGHT_LEVELS = 255  # weights are stored as round(weight * WEIGHT_LEVELS), one byte each
DIGITS = 3  # decimals kept of relevance and loss (nats)


# ----------------------------------------------------------------------------- data


def _rounded(values) -> list:
    """Floats rounded to DIGITS, NaN as None (JSON has no NaN)."""
    return [None if math.isnan(v) else round(float(v), DIGITS) for v in np.asarray(values, dtype=np.float64).ravel()]


def explorer_data(rel: Relevance, title: str = "", source: str = "", query: Optional[int] = None) -> dict:
    """The page's data: weights rows reach[t]..t per (layer, head, query), relevance rows reach[t]..t-1."""
    T = rel.num_tokens
    reach = rel.reach
    rows = [(t, slice(int(reach[t]), t + 1)) for t in range(T)]
    levels = np.concatenate([rel.weights[:, :, t, keys] for t, keys in rows], axis=-1)  # (L, H, R)
    levels = np.rint(np.clip(levels, 0.0, 1.0) * WEIGHT_LEVELS).astype(np.uint8)
    relevance = np.concatenate([rel.token_relevance[t, int(reach[t]):t] for t in range(T)])
    measured = [t for t in range(T) if not math.isnan(rel.losses[t])]
    if query is None:
        query = measured[-1] if measured else T - 1
    whole = agreement(rel)
    return {
        "title": title, "source": source, "tokens": rel.labels, "layers": rel.num_layers,
        "heads": rel.num_heads, "context": rel.context_length, "reach": [int(r) for r in reach],
        "weights": base64.b64encode(levels.tobytes()).decode("ascii"), "weight_levels": WEIGHT_LEVELS,
        "loss": _rounded(rel.losses), "relevance": _rounded(relevance),
        "head_ablation": [_rounded(row) for row in rel.head_relevance], "mean_loss": round(rel.mean_loss, DIGITS),
        "agreement": {"pairs": whole.pairs, "mean": _rounded([whole.mean])[0],
                      "by_layer": _rounded(whole.by_layer), "by_head": [_rounded(r) for r in whole.by_head]},
        "query": int(query),
    }


def weights_from_data(data: dict) -> np.ndarray:
    """The (L, H, T, T) weights a page's data holds (0 outside each query's reach): its inverse."""
    T, L, H = len(data["tokens"]), data["layers"], data["heads"]
    levels = np.frombuffer(base64.b64decode(data["weights"]), dtype=np.uint8).reshape(L, H, -1)
    weights = np.zeros((L, H, T, T), dtype=np.float32)
    offset = 0
    for t, start in enumerate(data["reach"]):
        width = t - start + 1
        weights[:, :, t, start:t + 1] = levels[:, :, offset:offset + width] / data["weight_levels"]
        offset += width
    return weights


def data_of_page(page: str) -> dict:
    """The data embedded in an explorer page."""
    match = re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.S)
    if match is None:
        raise TinyattnError("not an explorer page: it has no <script id=\"data\">")
    return json.loads(match.group(1))


# ----------------------------------------------------------------------------- the page


def explorer_html(rel: Relevance, title: str = "", source: str = "", query: Optional[int] = None) -> str:
    """The whole page as one string."""
    data = json.dumps(explorer_data(rel, title, source, query), separators=(",", ":"), ensure_ascii=False)
    data = data.replace("<", "\\u003c")  # "</script>" inside a token cannot end the block
    return (PAGE.replace("%TITLE%", html.escape(title or "attention explorer"))
            .replace("%STYLE%", STYLE).replace("%SCRIPT%", SCRIPT).replace("%DATA%", data))


def write_explorer(path: str | Path, rel: Relevance, title: str = "", source: str = "",
                   query: Optional[int] = None) -> Path:
    path = Path(path)
    path.write_text(explorer_html(rel, title, source, query), encoding="utf-8")
    return path


PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>%TITLE%</title>
<style>%STYLE%</style>
</head><body>
<header><h1>%TITLE%</h1><p id="source"></p><p id="note"></p></header>
<section id="controls">
  <label>layer <select id="layer"></select></label>
  <label>head <select id="head"></select></label>
  <span id="query-info"></span>
</section>
<section class="rows">
  <h2>Attention weights of the query <span class="hint" id="weights-title"></span></h2>
  <div class="tokens" id="weights-row"></div>
  <h2>Relevance to the query's prediction <span class="hint">rise in its loss when the token is masked
  out of attention in every layer; red: needed, teal: the prediction is better without it;
  scaled to this query's largest change</span></h2>
  <div class="tokens" id="relevance-row"></div>
  <h2>Surprise <span class="hint">each token's own loss: how badly the tokens before it predicted it</span></h2>
  <div class="tokens" id="loss-row"></div>
</section>
<section><h2>Loss along the text <span class="hint">loss of the prediction made at each position,
nats; the query's in red</span></h2><svg id="curve" viewBox="0 0 900 170" preserveAspectRatio="none"></svg></section>
<section><h2>Every head <span class="hint">rows: query tokens; columns: keys; grey: future or out of
reach; click one to select it</span></h2><div id="grid"></div></section>
<section><h2>Head ablation <span class="hint">rise in the text's mean loss with that head's output
zeroed, nats; click to select</span></h2><table id="ablation"></table><p id="agreement"></p></section>
<script type="application/json" id="data">%DATA%</script>
<script>%SCRIPT%</script>
</body></html>
"""

STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 18px 24px; color: #1f2328;
  max-width: 1100px; }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 14px; margin: 14px 0 4px; }
header p { margin: 2px 0; color: #57606a; }
.hint { font-weight: normal; color: #6e7781; font-size: 12px; }
#controls { position: sticky; top: 0; background: #fff; padding: 8px 0; border-bottom: 1px solid #d0d7de;
  z-index: 1; } #controls label { margin-right: 14px; }
#query-info { color: #1f2328; }
.tokens { font: 15px/1.9 ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; word-break: break-all; }
.tok { white-space: pre; padding: 2px 1px; border-radius: 2px; cursor: pointer; }
.tok.query { outline: 2px solid #cf222e; }
.tok.future { color: #b0b7be; } .tok.far { color: #b0b7be; background: repeating-linear-gradient(
  135deg, #f3f4f6 0 3px, #fff 3px 6px); }
#curve { width: 100%; height: 170px; background: #fafbfc; border: 1px solid #d0d7de; }
#grid .layer { display: flex; align-items: center; gap: 6px; margin: 4px 0; }
#grid .layer span { width: 56px; font-size: 12px; color: #57606a; }
#grid canvas { width: 120px; height: 120px; image-rendering: pixelated; border: 2px solid transparent;
  cursor: pointer; } #grid canvas.selected { border-color: #cf222e; }
#ablation { border-collapse: collapse; } #ablation td, #ablation th { padding: 3px 8px; text-align: right;
  font: 12px ui-monospace, Menlo, Consolas, monospace; border: 1px solid #eaeef2; }
#ablation td { cursor: pointer; } #ablation td.selected { outline: 2px solid #cf222e; }
"""

SCRIPT = r"""
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
const state = { layer: 0, head: 0, query: D.query, pinned: false };
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
const parse = v => v === "mean" ? "mean" : Number(v);
$("layer").addEventListener("change", e => { state.layer = parse(e.target.value); render(); });
$("head").addEventListener("change", e => { state.head = parse(e.target.value); render(); });
document.addEventListener("keydown", e => {
  if (e.key === "ArrowRight" || e.key === "ArrowLeft") {
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
  const a = D.agreement, corr = state.layer === "mean" ? a.mean
    : state.head === "mean" ? a.by_layer[state.layer] : a.by_head[state.layer][state.head];
  $("query-info").textContent = `query ${tok[q]} at ${q}${state.pinned ? " (pinned)" : ""} ${predicts}; ` +
    `reads ${reach[q]}..${q}. Weight vs relevance over the text (Spearman): ${corr === null ? "n/a" : corr.toFixed(2)}`;
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
  const a = D.agreement;
  $("agreement").textContent = `Mean loss ${D.mean_loss.toFixed(3)} nats over ${T - 1} predictions. ` +
    `Rank correlation (Spearman) of weight with relevance over the text's ${a.pairs} (query, earlier key) pairs: ` +
    `${a.mean === null ? "n/a" : a.mean.toFixed(2)} for the mean over every head; by layer ` +
    a.by_layer.map((v, l) => `${l}: ${v === null ? "n/a" : v.toFixed(2)}`).join(", ") + ".";
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
"""
