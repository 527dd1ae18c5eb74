"""The explorer: one self-contained HTML page of a text's attention weights and relevance.

`explorer_html(rel)` turns a `relevance.Relevance` into a page that opens from disk with no
network: the CSS, the script and the data are inline, and nothing is fetched. The page is
written as real files beside this module (`page.html`, `style.css`, `app.js`, package data),
filled in one pass when a page is made. It shows

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
from importlib import resources
from pathlib import Path
from typing import Optional

import numpy as np

from tinyattn.analysis.ablation import Agreement, Relevance, agreement
from tinyattn.errors import TinyattnError

WEIGHT_LEVELS = 255  # weights are stored as round(weight * WEIGHT_LEVELS), one byte each
DIGITS = 3  # decimals kept of relevance and loss (nats)


# ----------------------------------------------------------------------------- data


def _rounded(values) -> list:
    """Floats rounded to DIGITS, NaN as None (JSON has no NaN)."""
    return [None if math.isnan(v) else round(float(v), DIGITS) for v in np.asarray(values, dtype=np.float64).ravel()]


def explorer_data(rel: Relevance, title: str = "", source: str = "", query: Optional[int] = None, *,
                  layer: Optional[int] = None, head: Optional[int] = None) -> dict:
    """The page's data: weights rows reach[t]..t per (layer, head, query), relevance rows reach[t]..t-1.
    query, layer and head: what the page shows first (None: the last measured query, layer 0, head 0)."""
    T = rel.num_tokens
    reach = rel.reach
    rows = [(t, slice(int(reach[t]), t + 1)) for t in range(T)]
    levels = np.concatenate([rel.weights[:, :, t, keys] for t, keys in rows], axis=-1)  # (L, H, R)
    levels = np.rint(np.clip(levels, 0.0, 1.0) * WEIGHT_LEVELS).astype(np.uint8)
    relevance = np.concatenate([rel.token_relevance[t, int(reach[t]):t] for t in range(T)])
    measured = [t for t in range(T) if not math.isnan(rel.losses[t])]
    if query is None:
        query = measured[-1] if measured else T - 1
    whole, by_size = agreement(rel), agreement(rel, size=True)
    return {
        "title": title, "source": source, "tokens": rel.labels, "layers": rel.num_layers,
        "heads": rel.num_heads, "context": rel.context_length, "reach": [int(r) for r in reach],
        "weights": base64.b64encode(levels.tobytes()).decode("ascii"), "weight_levels": WEIGHT_LEVELS,
        "loss": _rounded(rel.losses), "relevance": _rounded(relevance),
        "head_ablation": [_rounded(row) for row in rel.head_relevance], "mean_loss": round(rel.mean_loss, DIGITS),
        "agreement": _agreement_data(whole), "agreement_by_size": _agreement_data(by_size),
        "query": int(query), "layer": int(layer or 0), "head": int(head or 0),
    }


def _agreement_data(found: Agreement) -> dict:
    return {"pairs": found.pairs, "mean": _rounded([found.mean])[0], "by_layer": _rounded(found.by_layer),
            "by_head": [_rounded(row) for row in found.by_head]}


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


# The page's files, package data beside this module.
PAGE_FILES = {"PAGE": "page.html", "STYLE": "style.css", "SCRIPT": "app.js"}
PLACEHOLDER = re.compile(r"%(TITLE|STYLE|SCRIPT|DATA)%")


def page_part(name: str) -> str:
    """The text of one of the page's files (PAGE_FILES), read from the installed package."""
    return resources.files("tinyattn.analysis").joinpath(PAGE_FILES[name]).read_text(encoding="utf-8")


def explorer_html(rel: Relevance, title: str = "", source: str = "", query: Optional[int] = None, *,
                  layer: Optional[int] = None, head: Optional[int] = None) -> str:
    """The whole page as one string: page.html with the style, the script and the data inline."""
    data = explorer_data(rel, title, source, query, layer=layer, head=head)
    data = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    data = data.replace("<", "\\u003c")  # "</script>" inside a token cannot end the block
    values = {"TITLE": html.escape(title or "attention explorer"), "STYLE": page_part("STYLE"),
              "SCRIPT": page_part("SCRIPT"), "DATA": data}
    # One pass over the template: what a value brings in (a title or a token holding "%DATA%")
    # is never itself read as a placeholder.
    return PLACEHOLDER.sub(lambda match: values[match.group(1)], page_part("PAGE"))


def write_explorer(path: str | Path, rel: Relevance, title: str = "", source: str = "",
                   query: Optional[int] = None, *, layer: Optional[int] = None,
                   head: Optional[int] = None) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)  # as eval --plot and export make theirs
    path.write_text(explorer_html(rel, title, source, query, layer=layer, head=head), encoding="utf-8")
    return path
