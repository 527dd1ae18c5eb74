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


@pytest.mark.parametrize("name", ["auto", "cpu"])
def test_good_device_names_are_accepted(name):
    assert select_device(name).type in ("cpu", "cuda", "mps")


def test_peak_flops_leaves_the_global_generator_alone():
    state = torch.get_rng_state()
    assert measure_peak_flops(CPU, select_precision("fp32", CPU), size=512) > 0
    assert torch.equal(torch.get_rng_state(), state)
