"""The analysis a training run's evaluations show: the `train.show` hooks that live here.

Each is `hook(shown)`, called by the training loop on the main process after an evaluation
(`tinyattn.train.hooks` names them and imports this module only when a config lists one);
`shown` carries the step, the plain model, the tokenizer, the config, the validation loss by
position and the TensorBoard writer. None needs matplotlib: the images are drawn with numpy.

- `loss_by_position`: `loss_by_position/positions_<range>` scalars and the `loss_by_position/plot` curve.
- `attention`: `attention/layer_<L>` heatmaps of `train.probe_text`.
- `head_ablation`: `head_ablation/grid`, which heads the probe text's loss needs.
"""

from __future__ import annotations

from tinyattn.analysis.ablation import log_head_ablation_to_tensorboard
from tinyattn.analysis.attention_maps import log_attention_to_tensorboard
from tinyattn.analysis.evaluate import log_loss_by_position_to_tensorboard


def show_loss_by_position(shown) -> None:
    log_loss_by_position_to_tensorboard(shown.writer, shown.position_losses, shown.step)


def show_attention(shown) -> None:
    log_attention_to_tensorboard(shown.writer, shown.model, shown.tokenizer, shown.config.train.probe_text,
                                 step=shown.step)


def show_head_ablation(shown) -> None:
    # A layer x head grid: L * H short forwards over the probe text, batched.
    log_head_ablation_to_tensorboard(shown.writer, shown.model, shown.tokenizer,
                                     shown.config.train.probe_text, step=shown.step)
