"""User-facing errors.

Every mistake a user can make (a bad config value, a missing file, a corrupt
checkpoint) raises a subclass of `TinyattnError` whose message is one line that
names the file, key or value and what would be accepted. The command-line faces
print that line and exit with status 2, without a traceback. Anything else is a
bug and keeps its traceback.
"""


class TinyattnError(Exception):
    """A problem the user can fix; its message is shown without a traceback."""


class ConfigError(TinyattnError):
    """A config file, key or value that cannot be used."""


class DataError(TinyattnError):
    """A data source or tokenizer that cannot be used."""


class CheckpointError(TinyattnError):
    """A run folder or checkpoint file that cannot be used."""


class StorageError(TinyattnError):
    """A folder that cannot take a file: disk full, read-only, no permission, or in use."""


def first_line(error: BaseException) -> str:
    """The first line of an error's message, for a one-line message of ours (its type's name where
    it has none)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """n and its noun for a message: "1 token", "0 tokens", "3 queries" (plural given where not noun + s)."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def parameter_count_text(n: int) -> str:
    """A model's size for a line or a card: millions to two decimals from a million up ("1.80M"), the
    exact count below it ("35,200"), where two decimals of a million would be far off ("0.04M")."""
    return f"{n / 1e6:.2f}M" if n >= 1_000_000 else f"{n:,}"
