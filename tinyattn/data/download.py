"""Fetching a corpus file once: `download(url, path)` with an optional size and sha256 check.

The bytes go through `atomic_write`, so a download that fails or fails a check leaves no
file behind and the next run downloads again instead of trusting half a file.
"""

from __future__ import annotations

import hashlib
import urllib.error
import urllib.request
from pathlib import Path
from typing import Optional

from tqdm import tqdm

from tinyattn.errors import DataError
from tinyattn.system.storage import atomic_write, looked_for_at


def download(url: str, path: Path, *, sha256: Optional[str], size_bytes: Optional[int],
             progress: bool) -> None:
    """Fetch `url` into `path` through a temporary file, checking its size and hash."""
    digest = hashlib.sha256()
    received = 0
    with atomic_write(path) as out:  # a failed download or check leaves no file behind
        try:
            with urllib.request.urlopen(url, timeout=60) as response:
                length = int(response.headers.get("Content-Length") or 0) or None
                with tqdm(total=length, unit="B", unit_scale=True, disable=not progress,
                          desc=f"downloading {path.name}") as bar:
                    while chunk := response.read(1 << 20):
                        out.write(chunk)
                        digest.update(chunk)
                        received += len(chunk)
                        bar.update(len(chunk))
        except (OSError, ValueError) as e:  # URLError, HTTPError are OSErrors; ValueError: bad URL
            reason = e.reason if type(e) is urllib.error.URLError else e
            raise DataError(f"data.url: cannot download {url} ({reason}); put the file at {path}"
                            f"{looked_for_at(path)} yourself (data.files)") from None
        # A connection closed early ends the reading as the end of the file would (read() returns
        # short, without an error): only the length the server announced tells them apart.
        if length is not None and received != length:
            raise DataError(f"data.url: {url} sent {received} bytes of the {length} its Content-Length "
                            "announced (the connection closed early); the download was deleted")
        if size_bytes is not None and received != size_bytes:
            raise DataError(f"data.url: {url} gave {received} bytes, not data.size_bytes={size_bytes}; "
                            "the download was deleted")
        if sha256 is not None and digest.hexdigest() != sha256.lower():
            raise DataError(f"data.url: {url} has sha256 {digest.hexdigest()}, not data.sha256={sha256}; "
                            "the download was deleted")
