"""Decoding speed: tokens/s with and without the KV cache, and time to first token.

    python -m benchmarks.decode                 # fp32/bf16 x 1/2 threads x plain/packed/fp16-row weights
    python -m benchmarks.decode --dtypes bf16 --threads 2 --pack yes --uncached-tokens 100 --json d.json
    python -m benchmarks.decode --dtypes fp32 --threads 2 --pack yes --compile no yes
    python -m benchmarks.decode --device cuda --dtypes bf16 --threads 1 --pack no --batch-sizes 1 16
    python -m benchmarks.decode --nanogpt /path/to/nanoGPT     # against nanoGPT's generate(), A/B

The model is the 6-layer, 6-head, width-384, context-256, vocabulary-65 one with random
weights (--config takes a config's whole model section instead: its shape, qk_norm, tied or
untied head and the rest), generating 500 tokens after
a 200-token prompt (shortened to fit the context) at batch 1 (--batch-sizes: more); see
`benchmarks.measure.measure_decode` for what is timed. Prints a Markdown table; "ms/step" is one
step of the whole batch (a token of each sequence: at batch 1, ms per token), "first run s" is
the warm-up run of 50 tokens, which with --compile yes includes compiling the decode step
(cold, or from inductor's cache on disk). Run it on an otherwise idle machine: with another
process busy, two torch threads can run many times slower than one.

--nanogpt DIR instead times nanoGPT's `GPT.generate()` (DIR/model.py, imported from there,
never copied) against the loop `tinyattn generate` runs, on the same architecture size (6
layers, 6 heads, width 384, context 256, vocabulary 65, random weights, batch 1): nanoGPT in
fp32 as it runs on a CPU (--nanogpt-bf16 adds a row with it under bf16 autocast), ours as the
command line prepares it (`prepare_for_generation(..., "auto")`: its dtype, packed weights with
fp16 copies for one-row products where it keeps them; eager: no --compile).
Both get the same random prompt (--prompt-tokens) and sample --new-tokens at temperature 0.8
with no top-k; nanoGPT recomputes its whole window (up to 256 tokens) for every token, as its
generate() does. Rounds alternate the two (--repeats rounds); each side's figure is the
median of its rounds, wall time from the prompt to the last token.
"""

import argparse
import contextlib
import dataclasses
import importlib.util
import itertools
import json
import statistics
import time
from pathlib import Path

import torch

from benchmarks.measure import DECODE_MODEL, measure_decode
from benchmarks.arguments import check_counts, check_output, write_figures
from tinyattn.cli import run_command
from tinyattn.config import ModelConfig, load_config
from tinyattn.errors import ConfigError, TinyattnError
from tinyattn.generate.decoder import generate_tokens, prepare_for_generation
from tinyattn.model.transformer import LanguageModel
from tinyattn.system.cpu import cpu_name


def main() -> int:
    parser = _parser()
    args = parser.parse_args()
    check_counts(args, LEAST)
    _refuse_options_not_used(args, parser)
    check_output(args.json)
    if args.nanogpt:
        return _against_nanogpt(args)
    args.threads = args.threads or [1, 2]
    model_config = _model_config(args.config, args.vocab_size)
    prompt_tokens = min(args.prompt_tokens, model_config.context_length)
    results = []
    for dtype, threads, pack, compile, batch in itertools.product(args.dtypes, args.threads, args.pack,
                                                                  args.compile, args.batch_sizes):
        if pack == "fp16-rows" and dtype != "fp32":
            continue  # fp16 copies are kept beside fp32 weights only (generate.decoder.row_weight_dtype)
        r = measure_decode(new_tokens=args.new_tokens, prompt_tokens=prompt_tokens,
                           uncached_tokens=args.uncached_tokens, dtype=dtype, threads=threads,
                           pack=pack != "no", row_dtype="fp16" if pack == "fp16-rows" else None,
                           compile=compile == "yes", repeats=args.repeats,
                           device=args.device, batch_size=batch, model_config=model_config)
        if not results:
            print(f"{r['cpu']}, torch {r['torch']}, {r['device']}; "
                  f"{r['model']['parameters'] / 1e6:.1f}M parameters; {r['new_tokens']} tokens after "
                  f"a {r['prompt_tokens']}-token prompt ({r['refills']} refills)\n")
            print("| dtype | threads | packed | compiled | batch | cached tok/s | ms/step | TTFT ms "
                  "| first run s | uncached tok/s | speedup |")
            print("|---|---|---|---|---|---|---|---|---|---|---|")
        packed = ("yes, fp16 rows" if r["row_dtype"] else "yes") if r["packed"] else "no"
        print(f"| {dtype} | {threads} | {packed} | {compile} | {batch} | "
              f"{r['cached_tokens_per_s']:.0f} | {r['cached_ms_per_step']:.2f} | "
              f"{r['ttft_ms']:.1f} | {r['first_run_s']:.1f} | {r['uncached_tokens_per_s']:.1f} | "
              f"{r['speedup']:.1f}x |", flush=True)
        results.append(r)
        if args.json:  # after each row: an interrupted or failing sweep keeps the rows it finished
            write_figures(args.json, json.dumps(results, indent=2) + "\n")
    return 0


def _model_config(config_path: str | None, vocab_size: int | None) -> ModelConfig:
    """The model to time: a config's whole model section (else measure_decode's default), with
    --vocab-size, else the config's vocabulary (its model's, else its BPE's), else 65."""
    if not config_path:
        return dataclasses.replace(DECODE_MODEL, vocab_size=vocab_size or DECODE_MODEL.vocab_size)
    config = load_config(config_path)
    # A config's model has no vocabulary of its own: training takes its tokenizer's.
    bpe = config.tokenizer.vocab_size if config.tokenizer.kind == "bpe" else None
    return dataclasses.replace(config.model, vocab_size=vocab_size or config.model.vocab_size or bpe or 65)


# What the comparison with nanoGPT does not use: the baby GPT on the CPU, ours prepared as `generate` does.
NOT_USED_WITH_NANOGPT = ("dtypes", "pack", "compile", "uncached_tokens", "batch_sizes", "config",
                         "vocab_size", "device", "json")


def _refuse_options_not_used(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """An option given that the chosen mode ignores is refused, not dropped without a word."""
    if not args.nanogpt and set(args.pack) == {"fp16-rows"} and "fp32" not in args.dtypes:
        raise ConfigError(f"--pack fp16-rows keeps fp16 copies beside fp32 weights only: with --dtypes "
                          f"{' '.join(args.dtypes)} nothing would be measured; expected --dtypes fp32, or "
                          "--pack no or yes")
    if args.nanogpt_bf16 and not args.nanogpt:
        raise ConfigError("--nanogpt-bf16 adds a row to the comparison with nanoGPT; expected it with "
                          "--nanogpt DIR")
    for name in NOT_USED_WITH_NANOGPT if args.nanogpt else ():
        if getattr(args, name) != parser.get_default(name):
            raise ConfigError(f"--{name.replace('_', '-')} is not used by the comparison with nanoGPT (its "
                              "baby GPT on the CPU, ours as `tinyattn generate` prepares it); expected "
                              "--nanogpt with --threads, --new-tokens, --prompt-tokens, --repeats and "
                              "--nanogpt-bf16 only")


# The fewest each count accepts, and why where it is not plain.
LEAST = {"new_tokens": (2, "the tokens after the first are timed"), "prompt_tokens": (1, ""),
         "repeats": (1, ""), "uncached_tokens": (1, ""), "threads": (1, ""), "batch_sizes": (1, ""),
         "vocab_size": (2, "")}


# ----------------------------------------------------------------------------- against nanoGPT

NANOGPT_SHAPE = dict(n_layer=6, n_head=6, n_embd=384, context_length=256, vocab_size=65)


def _against_nanogpt(args) -> int:
    """Alternating rounds of nanoGPT's generate() and ours; prints each round and the medians."""
    if args.threads:
        torch.set_num_threads(args.threads[0])
    nanogpt = _nanogpt_model(args.nanogpt)
    ours = _our_model()
    prompt_tokens = min(args.prompt_tokens, NANOGPT_SHAPE["context_length"])
    prompt = torch.randint(0, NANOGPT_SHAPE["vocab_size"], (1, prompt_tokens),
                           generator=torch.Generator().manual_seed(0))  # (1, T)
    sides = {"nanoGPT generate() fp32": lambda n: _time_nanogpt(nanogpt, prompt, n)}
    if args.nanogpt_bf16:
        sides["nanoGPT generate() bf16 autocast"] = lambda n: _time_nanogpt(nanogpt, prompt, n, autocast=True)
    sides[f"tinyattn generate ({ours[1]})"] = lambda n: _time_ours(ours[0], prompt, n)
    print(f"{cpu_name()}, torch {torch.__version__}, {torch.get_num_threads()} threads; batch 1, "
          f"{args.new_tokens} tokens after a {prompt_tokens}-token prompt, {args.repeats} alternating rounds\n")
    seconds = {name: [] for name in sides}
    for run in sides.values():  # warm-up: kernels, oneDNN's primitives
        run(min(args.new_tokens, 20))
    for round_number in range(1, args.repeats + 1):
        for name, run in sides.items():
            seconds[name].append(run(args.new_tokens))
        print(f"round {round_number}: " + ", ".join(f"{name} {s[-1]:.2f} s" for name, s in seconds.items()),
              flush=True)
    ours_s = statistics.median(seconds[list(sides)[-1]])
    print("\n| path | tokens/s | ms/token | tinyattn's speedup |\n|---|---:|---:|---:|")
    for name, s in seconds.items():
        median = statistics.median(s)
        print(f"| {name} | {args.new_tokens / median:.1f} | {1000 * median / args.new_tokens:.2f} "
              f"| {median / ours_s:.1f}x |")
    return 0


def _nanogpt_model(folder: Path):
    """nanoGPT's GPT with random weights, in eval mode, imported from folder/model.py."""
    path = folder / "model.py"
    if not path.is_file():
        raise TinyattnError(f"--nanogpt {folder}: no model.py there; expected a nanoGPT checkout")
    spec = importlib.util.spec_from_file_location("nanogpt_model", path)
    module = importlib.util.module_from_spec(spec)
    s = NANOGPT_SHAPE
    # Another project's model.py, or nanoGPT's needing a package not installed: one line, not its traceback.
    try:
        spec.loader.exec_module(module)
        if not (hasattr(module, "GPTConfig") and hasattr(module, "GPT")):
            raise AttributeError("no GPTConfig or GPT in it")
        config = module.GPTConfig(block_size=s["context_length"], vocab_size=s["vocab_size"],
                                  n_layer=s["n_layer"], n_head=s["n_head"], n_embd=s["n_embd"],
                                  dropout=0.0, bias=False)  # its train.py's bias
        torch.manual_seed(0)
        return module.GPT(config).eval()
    except Exception as e:  # noqa: BLE001 - the checkout's own code can raise anything
        raise TinyattnError(f"--nanogpt {folder}: {path} cannot build nanoGPT's GPT ({type(e).__name__}: "
                            f"{e}); expected a nanoGPT checkout with the packages its model.py imports"
                            ) from None


def _our_model() -> tuple[LanguageModel, str]:
    """Our model as `tinyattn generate` prepares it (`prepare_for_generation`, "auto"), and how."""
    torch.manual_seed(0)
    prepared = prepare_for_generation(LanguageModel(ModelConfig(**NANOGPT_SHAPE)).eval(), "auto",
                                      torch.device("cpu"))
    return prepared.model, f"{prepared.describe(torch.device('cpu'))}, eager"


def _time_nanogpt(model, prompt: torch.Tensor, new_tokens: int, autocast: bool = False) -> float:
    """Seconds for nanoGPT's generate() to sample new_tokens after prompt, as its sample.py calls it."""
    context = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    torch.manual_seed(1)
    start = time.perf_counter()
    with torch.no_grad(), context:
        model.generate(prompt, new_tokens, temperature=0.8, top_k=None)
    return time.perf_counter() - start


def _time_ours(model, prompt: torch.Tensor, new_tokens: int) -> float:
    """Seconds for the token loop of `tinyattn generate` (one generator per sample, each token read back
    as a list as the text streams do), detokenizing and printing left out."""
    generator = [torch.Generator().manual_seed(1)]
    start = time.perf_counter()
    for token in generate_tokens(model, prompt, new_tokens, temperature=0.8, generator=generator):
        token.tolist()
    return time.perf_counter() - start


# ----------------------------------------------------------------------------- arguments


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    parser.add_argument("--threads", nargs="+", type=int, default=None,
                        help="torch.set_num_threads values to try (default: 1 2; with --nanogpt: torch's own)")
    parser.add_argument("--pack", nargs="+", default=["no", "yes", "fp16-rows"], choices=["no", "yes", "fp16-rows"],
                        help="weights as they are and/or packed for oneDNN (pack_linear_weights); "
                             "fp16-rows: packed, with fp16 copies for one-row products (fp32 only)")
    parser.add_argument("--compile", nargs="+", default=["no"], choices=["no", "yes"],
                        help="the one-token decode step eager and/or compiled (default: no)")
    parser.add_argument("--new-tokens", type=int, default=500)
    parser.add_argument("--prompt-tokens", type=int, default=200)
    parser.add_argument("--uncached-tokens", type=int, default=None,
                        help="tokens timed without the cache (default: --new-tokens; it is slow)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1],
                        help="sequences decoded together (default: 1); tokens/s count all of them")
    parser.add_argument("--config", help="time this config's model (default: 6 layers, "
                                         "6 heads, width 384, context 256)")
    parser.add_argument("--vocab-size", type=int, default=None,
                        help="vocabulary of the random model (default: the config's, or its BPE's, else 65)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    parser.add_argument("--nanogpt", type=Path, metavar="DIR",
                        help="time nanoGPT's generate() from this checkout against ours instead (A/B rounds; "
                             "--threads: its first value, else torch's default; --new-tokens, --prompt-tokens, --repeats apply)")
    parser.add_argument("--nanogpt-bf16", action="store_true",
                        help="with --nanogpt: also time nanoGPT under bf16 autocast")
    return parser


if __name__ == "__main__":
    raise SystemExit(run_command(main))
