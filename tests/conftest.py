"""Shared fixtures: the repository root, the real corpus when present, offline hub."""

import os
import shutil
from pathlib import Path

# datasets reads this at import time: the hub is never reachable from the tests.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def shakespeare_path() -> Path:
    """data/tinyshakespeare.txt, which CI copies from ../shared/data before the tests."""
    path = ROOT / "data" / "tinyshakespeare.txt"
    if not path.exists():
        shared = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"
        if not shared.exists():
            pytest.skip("data/tinyshakespeare.txt is missing (CI copies it from ../shared/data)")
        path.parent.mkdir(exist_ok=True)
        shutil.copyfile(shared, path)
    return path


@pytest.fixture(autouse=True, scope="session")
def private_cache_dir(tmp_path_factory):
    """The CPU verdict cache (tinyattn.runtime) goes to a temporary folder, never ~/.cache."""
    os.environ["TINYATTN_CACHE_DIR"] = str(tmp_path_factory.mktemp("tinyattn_cache"))
    yield
