"""`tinyattn export` (`scripts/export.py`): a checkpoint as a Hugging Face Llama folder."""

from __future__ import annotations

import argparse

from tinyattn.cli import run_command
from tinyattn.cli.options import add_checkpoint, command_parser
from tinyattn.system.choices import EXPORT_PRECISIONS


def parser() -> argparse.ArgumentParser:
    p = command_parser(
        "export",
        "Write a checkpoint as a Hugging Face model folder (LlamaForCausalLM): config.json, "
        "model.safetensors, generation_config.json (from the run's sample section), the tokenizer files "
        "and a model card README.md. transformers' AutoModelForCausalLM and AutoTokenizer load it with no "
        "custom code. A model with model.qk_norm is written as Qwen3ForCausalLM; model.logit_softcap, "
        "which no standard architecture holds, is refused.",
        "example: tinyattn export --checkpoint checkpoints/<run> --out exported/<name>")
    add_checkpoint(p)
    p.add_argument("--out", required=True, metavar="DIR", help="the folder to write (new or empty)")
    p.add_argument("--dtype", choices=EXPORT_PRECISIONS, default="fp32",
                   help="the weights' dtype in the folder (default: fp32, the dtype tinyattn trains its "
                        "weights in)")
    p.add_argument("--force", action="store_true", help="replace an earlier export in --out")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)

    def command() -> int:
        from tinyattn.checkpoint import require_causal
        from tinyattn.hf.convert import DTYPES, safetensors_torch
        from tinyattn.hf.folder import ModelCard, export_folder, load_any_model

        safetensors_torch()  # before any work: a missing extra is a one-line error
        loaded = load_any_model(args.checkpoint)
        require_causal(loaded, "tinyattn export")
        card = ModelCard(str(loaded.path), loaded.step, loaded.tokens_seen, loaded.best_val_loss)
        files = export_folder(loaded.model.state_dict(), loaded.config, loaded.tokenizer, args.out,
                              dtype=DTYPES[args.dtype], card=card, force=args.force)
        print(f"{loaded.path} (step {loaded.step}): wrote {args.out}/ ({', '.join(f.name for f in files)})")
        return 0

    return run_command(command)
