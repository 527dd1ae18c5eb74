"""runtime: device names checked by one rule, the peak measurement leaves the random state alone."""

import re

import pytest
import torch

from tinyattn.config import config_from_dict
from tinyattn.errors import ConfigError
from tinyattn.system.device import measure_peak_flops, select_device, select_precision

CPU = torch.device("cpu")


@pytest.mark.parametrize("name", ["gpu", "cuda:", "cuda:x", "CPU"])
def test_a_bad_device_name_is_refused_alike_by_select_device_and_the_config(name):
    accepted = "expected auto, cpu, cuda, cuda:N or mps"
    with pytest.raises(ConfigError, match=re.escape(f"device {name!r} is not accepted; {accepted}")):
        select_device(name)
    with pytest.raises(ConfigError, match=re.escape(f"train.device: {name!r} is not accepted; {accepted}")):
        config_from_dict({"data": {"files": ["corpus.txt"]}, "train": {"device": name}})


def auto_device() -> torch.device:
    """What "auto" means: CUDA if present, then Apple MPS, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("mps" if torch.backends.mps.is_available() else "cpu")


@pytest.mark.parametrize("name", ["auto", "cpu", "mps", "cuda", "cuda:0", "cuda:12"])
def test_good_device_names_are_accepted(name):
    config = config_from_dict({"data": {"files": ["corpus.txt"]}, "train": {"device": name}})
    assert config.train.device == name  # kept as written: select_device resolves it when the run starts
    expected = auto_device() if name == "auto" else torch.device(name)
    if name == "mps":
        here = torch.backends.mps.is_available()
    elif name.startswith("cuda"):
        here = torch.cuda.is_available() and int(name.partition(":")[2] or 0) < torch.cuda.device_count()
    else:
        here = True  # auto and cpu: on every machine
    if here:
        assert select_device(name) == expected
    else:  # a device this machine lacks: refused as missing, not as a bad name
        with pytest.raises(ConfigError, match=re.escape(f"device {name!r} was asked for but")):
            select_device(name)


def test_peak_flops_leaves_the_global_generator_alone():
    state = torch.get_rng_state()
    assert measure_peak_flops(CPU, select_precision("fp32", CPU), size=512) > 0
    assert torch.equal(torch.get_rng_state(), state)


def test_peak_flops_on_the_cpu_stops_its_ladder_at_2048_so_cpu_mfu_figures_stay_comparable(monkeypatch):
    from tinyattn.system import device

    # Every matmul "takes" 1 ms: no size is slow enough to stop the ladder, so it climbs to its limit,
    # and the FLOP/s returned give away the size it measured there (2 n^3 / 1 ms).
    monkeypatch.setattr(device, "call_times", lambda fn, n, warmup, device: [1e-3] * n)
    monkeypatch.setattr(device, "seconds_of", lambda fn, device: 1e-3)
    flops = measure_peak_flops(CPU, select_precision("fp32", CPU))
    assert flops == 2 * 2048 ** 3 / 1e-3
