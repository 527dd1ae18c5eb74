"""Serving speed over HTTP: time to first token, streamed tokens/s, N concurrent clients.

    python -m benchmarks.serve                                   # the main config's shape, random weights
    python -m benchmarks.serve --checkpoint checkpoints/shakespeare_char --clients 1 4 8 --json s.json
    python -m benchmarks.serve --max-tokens 500 --threads 1 --repeats 5

`tinyattn serve` runs in a subprocess, as a user starts it (`--port 0`, the address read from
its first stderr line), so the clients' Python does not share the server's interpreter. Each
client is a thread streaming one POST /v1/completions (greedy, `stream_options.include_usage`)
with http.client; for each it records the time from sending the request to the first chunk
with text (TTFT) and to `data: [DONE]`. Per number of clients it prints the median TTFT, the
median of each client's streamed tokens/s (its tokens after the first over the time from the
first to the last), and the aggregate tokens/s (every client's tokens over the wall time from
the first request to the last [DONE]). The in-process figure is `generate()` on the same model
in this process: the HTTP, JSON and scheduling overhead is the difference.

Without --checkpoint the model has random weights in the shape of --config's model (default
configs/shakespeare_char.yaml: 4 layers, 4 heads, width 192, context 64, 1.8M parameters), a
character vocabulary of printable ASCII, and a run name from its shape (random-4x4x192). The
output head's row of the end-of-text token (the last id) is zeroed, so its logit is 0 and greedy
decoding, which takes the first of equal logits, does not pick it: text runs to --max-tokens (an
untied head starts at zero: every logit is 0 and the first id comes every time). Run it on an
otherwise idle machine: timings taken beside other work are not the server's.
"""

from __future__ import annotations

import argparse
import dataclasses
import http.client
import json
import os
import re
import statistics
import string
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from tinyattn.errors import TinyattnError

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "ROMEO:\nBut soft, what light through yonder window breaks?\n"


LEAST = {"max_tokens": (2, "the tokens after the first are timed"), "repeats": (1, ""), "clients": (1, ""),
         "threads": (1, "")}


def main() -> int:
    args = _parser().parse_args()
    from benchmarks.arguments import check_counts, check_output, write_figures
    from tinyattn.serve.server import require_serve_extra

    check_counts(args, LEAST)
    check_output(args.json)
    require_serve_extra()  # the server's refusal, before generate() is timed here
    with tempfile.TemporaryDirectory() as folder:
        checkpoint = args.checkpoint or str(_random_run(Path(folder), args.config))
        in_process = _in_process_tokens_per_s(checkpoint, args.max_tokens, args.threads)
        server, url, model_id = _start_server(checkpoint, max(args.clients), args.threads, args.max_tokens)
        try:
            print(f"{model_id}: {args.max_tokens} new tokens after a {len(PROMPT)}-character prompt, greedy, "
                  f"torch threads {args.threads}; generate() in one process: {in_process:.0f} tok/s\n")
            print("| clients | TTFT ms (median) | TTFT ms (worst) | streamed tok/s per client "
                  "| aggregate tok/s |")
            print("|---|---|---|---|---|")
            results = [_measure(url, model_id, clients, args) for clients in args.clients]
            for r in results:
                print(f"| {r['clients']} | {r['ttft_ms']:.1f} | {r['ttft_ms_worst']:.1f} | "
                      f"{r['tokens_per_s_per_client']:.0f} | {r['aggregate_tokens_per_s']:.0f} |", flush=True)
        finally:
            server.terminate()
            server.wait(timeout=30)
    if args.json:
        figures = {"in_process_tokens_per_s": in_process, "results": results}
        write_figures(args.json, json.dumps(figures, indent=2) + "\n")
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", help="a run folder or checkpoint (default: a random-weight model)")
    p.add_argument("--config", default=str(ROOT / "configs" / "shakespeare_char.yaml"),
                   help="the random model's shape comes from this config's model section")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 2, 4], help="concurrent clients to try")
    p.add_argument("--max-tokens", type=int, default=200, help="new tokens per request")
    p.add_argument("--repeats", type=int, default=3, help="rounds per number of clients (medians over them)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads of the server (and of generate()); default 1")
    p.add_argument("--json", type=Path, help="also write the figures here")
    return p


def _random_run(folder: Path, config_path: str) -> Path:
    """A run folder: a random-weight model of the config's shape, a printable-ASCII char vocabulary."""
    import torch

    from tinyattn import checkpoint as ckpt
    from tinyattn.config import Config, DataConfig, TokenizerConfig, config_to_dict, load_config
    from tinyattn.data.tokenizer import build_tokenizer
    from tinyattn.model.transformer import LanguageModel

    tokenizer = build_tokenizer(TokenizerConfig(kind="char"), lambda: iter([string.printable]))
    model_config = dataclasses.replace(load_config(config_path).model, vocab_size=tokenizer.vocab_size)
    config = Config(model=model_config, data=DataConfig(files=["corpus.txt"]),
                    tokenizer=TokenizerConfig(kind="char"))
    torch.manual_seed(0)
    model = LanguageModel(model_config).eval()
    with torch.no_grad():
        model.head.weight[tokenizer.eot_id] = 0  # the embedding's too where tied: logit 0
    m = model_config
    run = folder / f"random-{m.n_layer}x{m.n_head}x{m.n_embd}"
    ckpt.save_checkpoint({"config": config_to_dict(config), "model": model.state_dict(),
                          "tokenizer": tokenizer.to_json(), "step": 0}, run / "best.pt")
    return run


def _in_process_tokens_per_s(checkpoint: str, max_tokens: int, threads: int) -> float:
    """generate()'s tokens/s after the first token, in this process, on the model as the server
    holds it (`--dtype fp32`, prepared as `tinyattn serve` and `tinyattn generate` prepare it)."""
    import torch

    from tinyattn.generate.decoder import prepare_for_generation
    from tinyattn.generate.text import generate_samples
    from tinyattn.hf.folder import load_any_model

    torch.set_num_threads(threads)
    loaded = load_any_model(checkpoint, "cpu")
    prepare_for_generation(loaded.model, "fp32", torch.device("cpu"))
    for _ in range(2):  # the first run warms up
        # the time of each piece with text; the finish piece after the last token has none
        times = [time.perf_counter() for piece in generate_samples(
            loaded.model, loaded.tokenizer, PROMPT, max_new_tokens=max_tokens, temperature=0) if piece.text]
    if len(times) < 2:  # the model's end of text at once: the server's stream would end there too
        raise TinyattnError(f"{checkpoint}: generate() gave {len(times)} token(s) of text for the "
                            "benchmark's prompt before the model's end of text: nothing to time; "
                            "try another checkpoint")
    return (len(times) - 1) / (times[-1] - times[0])  # as the HTTP side's (tokens - 1) / (end - first)


def _start_server(checkpoint: str, max_active: int, threads: int, max_tokens: int):
    command = [sys.executable, "-m", "tinyattn", "serve", "--checkpoint", checkpoint, "--port", "0",
               "--dtype", "fp32", "--max-active", str(max_active), "--max-tokens", str(max_tokens)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}
    server = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    line = server.stderr.readline()
    found = re.search(r"serving '(.+?)'.* at (http://[^ ]+)", line)
    if not found:
        server.kill()
        raise SystemExit(f"the server did not start: {line}{server.stderr.read()}")
    threading.Thread(target=server.stderr.read, daemon=True).start()  # keep its stderr drained
    return server, found.group(2), found.group(1)


def _stream_one(url: str, model_id: str, max_tokens: int) -> dict:
    """One streamed completion: seconds to the first text and to [DONE], and its token count."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=600)
    body = json.dumps({"model": model_id, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0,
                       "stream": True, "stream_options": {"include_usage": True}})
    start = time.perf_counter()
    connection.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    if response.status != 200:  # a prompt past a small model's context: the server's own reason, in one line
        _refused(url, json.loads(response.read()))
    first, tokens = None, 0
    for line in response:
        if not line.startswith(b"data: "):
            continue
        if line.strip() == b"data: [DONE]":
            break
        chunk = json.loads(line[len(b"data: "):])
        if "error" in chunk:
            _refused(url, chunk)
        if first is None and any(c["text"] for c in chunk["choices"]):
            first = time.perf_counter()
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
    end = time.perf_counter()
    connection.close()
    if first is None:
        raise TinyattnError(f"{url}: the server streamed no text for the benchmark's prompt (the model ended "
                            "it at once): nothing to time; try another checkpoint")
    return {"start": start, "ttft": first - start, "end": end, "tokens": tokens,
            "tokens_per_s": (tokens - 1) / (end - first)}


def _refused(url: str, answer: dict) -> None:
    raise TinyattnError(f"{url}: the server refused the benchmark's request: {answer['error']['message']}")


def _measure(url: str, model_id: str, clients: int, args) -> dict:
    _stream_one(url, model_id, min(20, args.max_tokens))  # warm-up, within the server's --max-tokens
    rounds = []
    for _ in range(args.repeats):
        done: list[dict] = []
        failed: list[Exception] = []

        def client() -> None:  # a client's error ends the benchmark: a round of fewer clients is not this row
            try:
                done.append(_stream_one(url, model_id, args.max_tokens))
            except Exception as e:  # noqa: BLE001 - raised again below, in the main thread
                failed.append(e)

        threads = [threading.Thread(target=client) for _ in range(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if failed:
            raise failed[0]
        wall = max(r["end"] for r in done) - min(r["start"] for r in done)
        rounds.append({"ttft": [r["ttft"] for r in done], "per_client": [r["tokens_per_s"] for r in done],
                       "aggregate": sum(r["tokens"] for r in done) / wall})
    ttfts = [t for r in rounds for t in r["ttft"]]
    return {"clients": clients, "ttft_ms": 1000 * statistics.median(ttfts),
            "ttft_ms_worst": 1000 * max(ttfts),
            "tokens_per_s_per_client": statistics.median(v for r in rounds for v in r["per_client"]),
            "aggregate_tokens_per_s": statistics.median(r["aggregate"] for r in rounds)}


if __name__ == "__main__":
    from tinyattn.cli import run_command

    sys.exit(run_command(main))
