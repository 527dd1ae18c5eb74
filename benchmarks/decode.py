"""Decoding speed: tokens/s with and without the KV cache, and time to first token.

    python -m benchmarks.decode                 # fp32/bf16 x 1/2 threads x plain/packed weights
    python -m benchmarks.decode --dtypes bf16 --threads 2 --pack yes --uncached-tokens 100 --json d.json
    python -m benchmarks.decode --dtypes fp32 --threads 2 --pack yes --compile no yes
    python -m benchmarks.decode --device cuda --dtypes bf16 --threads 1 --pack no --batch-sizes 1 16

The model is the 6-layer, 6-head, width-384, context-256, vocabulary-65 one with random
weights (--config takes the shape of a config's model instead), generating 500 tokens after
a 200-token prompt (shortened to fit the context) at batch 1 (--batch-sizes: more); see
`benchmarks.measure.measure_decode` for what is timed. Prints a Markdown table; "first run s" is
the warm-up run of 50 tokens, which with --compile yes includes compiling the decode step
(cold, or from inductor's cache on disk). Run it on an otherwise idle machine: with another
process busy, two torch threads can run many times slower than one.
"""

import argparse
import itertools
import json
from pathlib import Path

from benchmarks.measure import measure_decode
from tinyattn.cli import run_command
from tinyattn.config import load_config


def main() -> int:
    args = _parser().parse_args()
    shape = _model_shape(args.config, args.vocab_size)
    prompt_tokens = min(args.prompt_tokens, shape.get("context_length", 256))
    results = []
    for dtype, threads, pack, compile, batch in itertools.product(args.dtypes, args.threads, args.pack,
                                                                  args.compile, args.batch_sizes):
        r = measure_decode(new_tokens=args.new_tokens, prompt_tokens=prompt_tokens,
                           uncached_tokens=args.uncached_tokens, dtype=dtype, threads=threads,
                           pack=pack == "yes", compile=compile == "yes", repeats=args.repeats,
                           device=args.device, batch_size=batch, **shape)
        if not results:
            print(f"{r['cpu']}, torch {r['torch']}, {r['device']}; "
                  f"{r['model']['parameters'] / 1e6:.1f}M parameters; {r['new_tokens']} tokens after "
                  f"a {r['prompt_tokens']}-token prompt ({r['refills']} refills)\n")
            print("| dtype | threads | packed | compiled | batch | cached tok/s | ms/token | TTFT ms "
                  "| first run s | uncached tok/s | speedup |")
            print("|---|---|---|---|---|---|---|---|---|---|---|")
        print(f"| {dtype} | {threads} | {'yes' if r['packed'] else 'no'} | {compile} | {batch} | "
              f"{r['cached_tokens_per_s']:.0f} | {r['cached_ms_per_token']:.2f} | "
              f"{r['ttft_ms']:.1f} | {r['first_run_s']:.1f} | {r['uncached_tokens_per_s']:.1f} | "
              f"{r['speedup']:.1f}x |", flush=True)
        results.append(r)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


def _model_shape(config_path: str | None, vocab_size: int | None) -> dict:
    """measure_decode's model arguments from a config's model (and --vocab-size); {} for its default."""
    shape = {}
    if config_path:
        m = load_config(config_path).model
        shape = dict(n_layer=m.n_layer, n_head=m.n_head, n_kv_head=m.n_kv_head, n_embd=m.n_embd,
                     context_length=m.context_length)
        if m.vocab_size:
            shape["vocab_size"] = m.vocab_size
    if vocab_size:
        shape["vocab_size"] = vocab_size
    return shape


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2],
                        help="torch.set_num_threads values to try (default: 1 2)")
    parser.add_argument("--pack", nargs="+", default=["no", "yes"], choices=["no", "yes"],
                        help="weights as they are and/or packed for oneDNN (pack_linear_weights)")
    parser.add_argument("--compile", nargs="+", default=["no"], choices=["no", "yes"],
                        help="the one-token decode step eager and/or compiled (default: no)")
    parser.add_argument("--new-tokens", type=int, default=500)
    parser.add_argument("--prompt-tokens", type=int, default=200)
    parser.add_argument("--uncached-tokens", type=int, default=None,
                        help="tokens timed without the cache (default: --new-tokens; it is slow)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1],
                        help="sequences decoded together (default: 1); tokens/s count all of them")
    parser.add_argument("--config", help="take the model's shape from this config (default: 6 layers, "
                                         "6 heads, width 384, context 256)")
    parser.add_argument("--vocab-size", type=int, default=None,
                        help="vocabulary of the random model (default: the config's, else 65)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    return parser


if __name__ == "__main__":
    raise SystemExit(run_command(main))
