"""Placeholder: the `causal` experiment of `tinyattn lab` (being written)."""

from __future__ import annotations

import argparse

from tinyattn.errors import TinyattnError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    raise TinyattnError("tinyattn lab causal is not written yet")
