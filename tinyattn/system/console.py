"""Lines for the user on stderr that a training run also keeps in its train.log.

A layer below training (the data, the tokenizer's cache) cannot call the run's logger, and its
warnings were on the console only, where a closed terminal loses them. `notice` prints a line
and hands it to the logger `RUN_LOG_NAME`, which `tinyattn.train.log.RunLog` writes to
`<run>/train.log` while a training run is open; outside a run that logger writes nowhere.
"""

from __future__ import annotations

import logging
import sys

RUN_LOG_NAME = "tinyattn.run"


def notice(line: str) -> None:
    """`line` (a "warning: ..." or "note: ..." for the user) on stderr, and in the open run's train.log."""
    print(line, file=sys.stderr, flush=True)
    logging.getLogger(RUN_LOG_NAME).info(line)
