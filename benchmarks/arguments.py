"""What the benchmark scripts share about their command lines: counts checked before any work."""

from __future__ import annotations

import argparse

from tinyattn.errors import ConfigError


def check_counts(args: argparse.Namespace, least: dict[str, tuple[int, str]]) -> None:
    """Each count in `least` ({dest: (the least accepted, why)}) as typed, a single value or a list;
    one below its least is a ConfigError naming the option as typed (one line, exit 2 by run_command)."""
    for name, (lowest, why) in least.items():
        values = getattr(args, name)
        for value in values if isinstance(values, list) else [values]:
            if value is not None and value < lowest:
                raise ConfigError(f"--{name.replace('_', '-')} {value} is not accepted: expected at least "
                                  f"{lowest}" + (f" ({why})" if why else ""))
