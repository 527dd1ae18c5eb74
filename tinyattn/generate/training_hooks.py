"""The sample a training run's evaluations show: the `sample` hook of `train.show`.

`tinyattn.train.hooks` names it and imports this module only when a config lists it; the
hook is handed a `tinyattn.train.hooks.Shown` (the step, the plain model, the tokenizer, the
config, the writer, the run folder).
"""

from __future__ import annotations

import torch

from tinyattn.generate.text import generate
from tinyattn.system.storage import storage_errors


def show_sample(shown) -> None:
    """`sample`: train.sample_tokens of text from sample.prompt, the same seed at every
    evaluation (so samples differ only by what the model learned), to samples.txt and TensorBoard."""
    tc, s = shown.config.train, shown.config.sample
    if tc.sample_tokens == 0:
        return
    device = next(shown.model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(tc.seed)
    text = "".join(generate(shown.model, shown.tokenizer, s.prompt, max_new_tokens=tc.sample_tokens,
                            temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
                            repetition_penalty=s.repetition_penalty, generator=generator))
    if shown.run_dir is not None:
        path = shown.run_dir / "samples.txt"
        with storage_errors(path), open(path, "a", encoding="utf-8") as f:
            f.write(f"--- step {shown.step} ---\n{text}\n")
    shown.writer.add_text("sample", "```\n" + text + "\n```", shown.step)
