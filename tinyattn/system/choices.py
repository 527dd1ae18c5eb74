"""The device and precision names a user may type, with the one check of each.

Torch-free on purpose: `tinyattn.config` and every command's `--help` read these names, and
neither should wait for torch to import. `tinyattn.system.device` turns them into devices
and dtypes.
"""

from __future__ import annotations

import re
from typing import Any, Callable

DEVICE_PATTERN = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")
DEVICE_NAMES = "auto, cpu, cuda, cuda:N or mps"  # what DEVICE_PATTERN accepts, as help and errors say it
PRECISION_NAMES = ("fp32", "bf16", "fp16")  # the dtypes computation can run in (device.DTYPES)
PRECISIONS = ("auto", *PRECISION_NAMES)  # train.precision and generate --dtype; auto: select_precision chooses
EXPORT_PRECISIONS = ("fp32", "bf16")  # export --dtype: what a Hugging Face folder's weights are saved in
GGUF_PRECISIONS = ("fp32", "fp16", "bf16")  # export --dtype for a GGUF file's matrices


def check_device(name: str, fail: Callable[[str, Any, str], None], key: str = "device") -> None:
    """The one rule for device names, train.device and every --device: fail(key, name, accepted)."""
    if not isinstance(name, str) or not DEVICE_PATTERN.match(name):
        fail(key, name, f"expected {DEVICE_NAMES}")
