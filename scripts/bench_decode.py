"""Decoding speed at batch 1: tokens/s with and without the KV cache, and time to first token.

    python scripts/bench_decode.py                 # fp32/bf16 x 1/2 threads x plain/packed weights
    python scripts/bench_decode.py --dtypes bf16 --threads 2 --pack yes --uncached-tokens 100 --json d.json
    python scripts/bench_decode.py --dtypes fp32 --threads 2 --pack yes --compile no yes

The model is the 6-layer, 6-head, width-384, context-256, vocabulary-65 one with random
weights, generating 500 tokens after a 200-token prompt; see `tinyattn.bench.measure_decode`
for what is timed. Prints a Markdown table; "first run s" is the warm-up run of 50 tokens,
which with --compile yes includes compiling the decode step (cold, or from inductor's cache
on disk). Run it on an otherwise idle machine: with another process busy, two torch threads
can run many times slower than one.
"""

import argparse
import json
from pathlib import Path

from tinyattn.bench import measure_decode


def main() -> int:
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
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args()

    results = []
    for dtype in args.dtypes:
        for threads in args.threads:
            for pack, compile in [(p, c) for p in args.pack for c in args.compile]:
                r = measure_decode(new_tokens=args.new_tokens, prompt_tokens=args.prompt_tokens,
                                   uncached_tokens=args.uncached_tokens, dtype=dtype, threads=threads,
                                   pack=pack == "yes", compile=compile == "yes", repeats=args.repeats,
                                   device=args.device)
                if not results:
                    print(f"{r['cpu']}, torch {r['torch']}, {r['device']}; "
                          f"{r['model']['parameters'] / 1e6:.1f}M parameters; {r['new_tokens']} tokens after "
                          f"a {r['prompt_tokens']}-token prompt ({r['refills']} refills)\n")
                    print("| dtype | threads | packed | compiled | cached tok/s | ms/token | TTFT ms "
                          "| first run s | uncached tok/s | speedup |")
                    print("|---|---|---|---|---|---|---|---|---|---|")
                print(f"| {dtype} | {threads} | {'yes' if r['packed'] else 'no'} | {compile} | "
                      f"{r['cached_tokens_per_s']:.0f} | {r['cached_ms_per_token']:.2f} | "
                      f"{r['ttft_ms']:.1f} | {r['first_run_s']:.1f} | {r['uncached_tokens_per_s']:.1f} | "
                      f"{r['speedup']:.1f}x |", flush=True)
                results.append(r)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
