"""`tinyattn export` (`scripts/export.py`): a checkpoint as a Hugging Face folder (Llama, Qwen3
or Qwen3.5), or as one GGUF file for llama.cpp (`--format gguf`, `--gguf FILE`, or `--out FILE.gguf`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from tinyattn.cli import run_command
from tinyattn.cli.options import add_checkpoint, command_parser
from tinyattn.config import home_path
from tinyattn.errors import ConfigError
from tinyattn.system.choices import EXPORT_PRECISIONS, GGUF_PRECISIONS

FORMATS = ("hf", "gguf")


def parser() -> argparse.ArgumentParser:
    p = command_parser(
        "export",
        "Write a checkpoint as a Hugging Face model folder (LlamaForCausalLM): config.json, "
        "model.safetensors, generation_config.json (from the run's sample section), the tokenizer files "
        "and a model card README.md. transformers' AutoModelForCausalLM and AutoTokenizer load it with no "
        "custom code. A model with model.qk_norm is written as Qwen3ForCausalLM, with model.attention_gate "
        "too as Qwen3_5ForCausalLM; model.logit_softcap, which no standard architecture holds, is refused. "
        "With --format gguf (or --gguf FILE) it writes one .gguf file instead, which llama.cpp (llama-cli, "
        "ollama, LM Studio) loads: the llama architecture, qwen3 with model.qk_norm, or qwen35 with "
        "model.attention_gate too; this needs the gguf extra.",
        "examples: tinyattn export --checkpoint checkpoints/<run> --out exported/<name>; "
        "tinyattn export --checkpoint checkpoints/<run> --gguf exported/<name>.gguf --dtype fp16")
    add_checkpoint(p)
    p.add_argument("--out", type=home_path, metavar="DIR|FILE",
                   help="the folder to write (new or empty); with --format gguf, the .gguf file")
    p.add_argument("--format", choices=FORMATS,
                   help="hf: a Hugging Face folder; gguf: one file for llama.cpp (default: gguf when --out "
                        "ends in .gguf, else hf)")
    p.add_argument("--gguf", type=home_path, metavar="FILE", help="the same as --format gguf --out FILE")
    p.add_argument("--dtype", choices=sorted(set(EXPORT_PRECISIONS) | set(GGUF_PRECISIONS)), default="fp32",
                   help="the weights' dtype (default: fp32, the dtype tinyattn trains its weights in); "
                        f"a folder holds {', '.join(EXPORT_PRECISIONS)}, a GGUF file {', '.join(GGUF_PRECISIONS)}")
    p.add_argument("--force", action="store_true",
                   help="replace an earlier export in --out (a GGUF file, or a folder tinyattn exported: "
                        "only an export's files, its README.md tinyattn's model card); never a checkpoint, "
                        "a downloaded model or another file")
    return p


def destination(args: argparse.Namespace) -> tuple[str, str]:
    """(format, path) from --format/--out/--gguf, or a one-line ConfigError."""
    if args.gguf is not None:
        if args.out is not None or args.format is not None:
            raise ConfigError("--gguf FILE stands for --format gguf --out FILE: give one or the other")
        return "gguf", args.gguf
    if args.out is None:
        raise ConfigError("--out: the folder (or with --format gguf, the file) to write is required")
    kind = args.format or ("gguf" if args.out.lower().endswith(".gguf") else "hf")
    accepted = EXPORT_PRECISIONS if kind == "hf" else GGUF_PRECISIONS
    if args.dtype not in accepted:
        raise ConfigError(f"--dtype {args.dtype}: --format {kind} writes {', '.join(accepted)}")
    return kind, args.out


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)

    def command() -> int:
        from tinyattn.checkpoint import require_causal
        from tinyattn.hf.folder import load_any_model

        kind, out = destination(args)
        if kind == "gguf":
            from tinyattn.gguf.writer import gguf_package
            gguf_package()  # before any work: a missing extra is a one-line error
        else:
            from tinyattn.hf.convert import safetensors_torch
            safetensors_torch()
        loaded = load_any_model(args.checkpoint)
        require_causal(loaded, "tinyattn export")
        refuse_the_source(loaded, out, kind)
        return export_gguf(loaded, out, args) if kind == "gguf" else export_hf(loaded, out, args)

    return run_command(command)


def refuse_the_source(loaded, out: str, kind: str) -> None:
    """Refuse, with or without --force, an `out` that is what the export reads: the checkpoint file,
    another checkpoint of its run (best.pt, step_<N>.pt), or the Hugging Face folder it came from."""
    from tinyattn.checkpoint import BEST, step_of

    target, source = Path(out).resolve(), loaded.path.resolve()
    if target == source:
        raise ConfigError(f"{out}: the file this export reads ({loaded.path}); choose another path to write")
    if target == source.parent:
        raise ConfigError(f"{out}: the folder this export reads ({loaded.path.parent}); choose another "
                          "path to write")
    run_checkpoint = target.name == BEST or step_of(target) is not None
    if not loaded.hf_folder and target.parent == source.parent and run_checkpoint:
        raise ConfigError(f"{out}: a checkpoint of the run this export reads ({loaded.path.parent}); "
                          "choose another path to write")


def export_hf(loaded, out: str, args: argparse.Namespace) -> int:
    from tinyattn.hf.convert import DTYPES
    from tinyattn.hf.folder import ModelCard, export_folder, training_rows

    # A Hugging Face folder records no training run: its card says none. The source is the path as
    # given where it names the run's folder (not `best.pt` for `--checkpoint .`).
    source = loaded.path if loaded.path.parent.name == loaded.name else Path(loaded.name, loaded.path.name)
    card = None if loaded.hf_folder else ModelCard(str(source), loaded.step, loaded.tokens_seen,
                                                   loaded.best_val_loss)
    # A folder tinyattn exported, exported again (to bf16, say): its card's training rows go on.
    earlier = training_rows(loaded.path.parent) if loaded.hf_folder else []
    files = export_folder(loaded.model.state_dict(), loaded.config, loaded.tokenizer, out,
                          dtype=DTYPES[args.dtype], card=card, force=args.force, earlier=earlier)
    print(f"{loaded.label}: wrote {out}/ ({', '.join(f.name for f in files)})")
    return 0


def export_gguf(loaded, out: str, args: argparse.Namespace) -> int:
    from tinyattn.gguf.writer import architecture_of, write_gguf

    model_config = loaded.config.model
    architecture = architecture_of(model_config)  # refuses what llama.cpp cannot hold, before writing
    path = write_gguf(loaded.model.state_dict(), model_config, loaded.tokenizer, out, dtype=args.dtype,
                      name=loaded.name, force=args.force)  # the run's name
    print(f"{loaded.label}: wrote {path} (llama.cpp architecture {architecture}, "
          f"{args.dtype}, {file_size(path.stat().st_size)})")
    return 0


def file_size(size: int) -> str:
    """A file's size in MiB to one decimal, or in KiB below one MiB, where a tenth of a MiB would name a
    small model's fp32 and fp16 files alike."""
    return f"{size / 2**20:.1f} MiB" if size >= 2**20 else f"{size / 2**10:.1f} KiB"
