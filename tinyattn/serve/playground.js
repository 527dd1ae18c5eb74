"use strict";
// The playground: streams /v1/completions (server-sent events, OpenAI's chunks) into #output,
// one span per streamed piece (a token's text), and on a click asks /explorer for the
// explorer page of the text so far at the prediction that produced that piece.
const $ = id => document.getElementById(id);
const MODEL = $("model").dataset.model;
let controller = null;

function status(text, error = false) { $("status").textContent = text; $("status").className = error ? "error" : ""; }
function numberOf(id) { const v = $(id).value.trim(); return v === "" ? undefined : Number(v); }
function unescapeStop(s) { return s.replace(/\\n/g, "\n").replace(/\\t/g, "\t"); }

function request() {
  const body = { model: MODEL, prompt: $("prompt").value, stream: true, max_tokens: numberOf("max-tokens"),
                 temperature: numberOf("temperature"), top_p: numberOf("top-p"), top_k: numberOf("top-k"),
                 seed: numberOf("seed") };
  if ($("stop").value) body.stop = [unescapeStop($("stop").value)];
  for (const key of Object.keys(body)) if (body[key] === undefined) delete body[key];
  return body;
}

function fullText() { return $("output").textContent; }
// Offsets sent to the server count code points, as a Python str does ("😀" is one, not two UTF-16 units).
function codePoints(s) { return [...s].length; }

function addPiece(text) {
  if (!text) return;
  const span = document.createElement("span");
  span.className = "tok"; span.textContent = text;
  span.dataset.start = codePoints(fullText());
  span.dataset.index = $("output").querySelectorAll(".tok").length;
  span.addEventListener("click", () => explore(span));
  $("output").appendChild(span);
}

async function errorMessage(response) {
  try { return (await response.json()).error.message; } catch (e) { return `HTTP ${response.status}`; }
}

async function readEvents(response, onChunk) {  // server-sent events: "data: {...}" blocks, then [DONE]
  const reader = response.body.getReader(), decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end); buffer = buffer.slice(end + 2);
      const data = block.split("\n").filter(l => l.startsWith("data: ")).map(l => l.slice(6)).join("\n");
      if (data === "[DONE]") return;
      if (data) onChunk(JSON.parse(data));
    }
  }
}

async function generate() {
  const output = $("output");
  output.textContent = "";
  const prompt = document.createElement("span");
  prompt.className = "prompt"; prompt.textContent = $("prompt").value;
  output.appendChild(prompt);
  controller = new AbortController();
  $("generate").disabled = true; $("stop-button").disabled = false;
  status("generating...");
  let pieces = 0, finish = null, warnings = [];
  const started = performance.now();
  try {
    const response = await fetch("/v1/completions", { method: "POST", headers: { "Content-Type": "application/json" },
                                                      body: JSON.stringify(request()), signal: controller.signal });
    if (!response.ok) { status(await errorMessage(response), true); return; }
    await readEvents(response, chunk => {
      if (chunk.error) throw new Error(chunk.error.message);
      warnings = warnings.concat(chunk.warnings || []);  // how the prompt was read: characters read as [UNK]
      for (const choice of chunk.choices) { addPiece(choice.text); pieces += choice.text ? 1 : 0;
        finish = choice.finish_reason || finish; }
    });
    const seconds = (performance.now() - started) / 1000;
    status(`done: ${pieces} pieces in ${seconds.toFixed(2)} s (finish: ${finish}); click a generated token`
           + warnings.map(w => `; warning: ${w}`).join(""));
  } catch (e) {
    status(e.name === "AbortError" ? "stopped" : String(e.message || e), e.name !== "AbortError");
  } finally {
    $("generate").disabled = false; $("stop-button").disabled = true; controller = null;
  }
}

async function explore(span) {
  for (const s of $("output").querySelectorAll(".tok.selected")) s.classList.remove("selected");
  span.classList.add("selected");
  const offset = Number(span.dataset.start) + codePoints(span.textContent) - 1;  // the piece's last character
  // From an empty prompt, generation began at the start token, which predicted the first piece: say so.
  const emptyPrompt = $("output").querySelector(".prompt").textContent === "";
  const body = { text: fullText(), offset, empty_prompt: emptyPrompt };
  status("measuring attention and relevance...");
  const response = await fetch("/explorer", { method: "POST", headers: { "Content-Type": "application/json" },
                                              body: JSON.stringify(body) });
  if (!response.ok) { status(await errorMessage(response), true); return; }
  $("explorer").srcdoc = await response.text();
  $("explorer-panel").hidden = false;
  $("explorer-title").textContent = `the prediction that produced ${JSON.stringify(span.textContent)} ` +
    `(piece ${span.dataset.index}): its weights beside each earlier token's relevance`;
  status("explorer ready");
}

$("generate").addEventListener("click", generate);
$("stop-button").addEventListener("click", () => controller && controller.abort());
$("prompt").addEventListener("keydown", e => { if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) generate(); });
