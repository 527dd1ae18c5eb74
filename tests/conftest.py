"""Shared fixtures: the repository root, the real corpus when present, offline hub."""

import os
import shutil
import subprocess
from pathlib import Path

# datasets reads this at import time: the hub is never reachable from the tests.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# Inductor checks each vector ISA the CPU names by building and loading a test program with the
# compiler (ten builds at the first compile into an empty cache folder, as on a fresh CI machine;
# docs/BENCHMARKS.md "Start-up" has the time). The suite takes the CPU's word for them: it picks
# the same ISA, and a compiler that could not build one would fail the compiled tests rather than
# fall back to a narrower one.
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")

import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def shakespeare_path() -> Path:
    """data/tinyshakespeare.txt, else ../shared/data's copy, read where it is: the tests never
    write into the repository's data/ folder."""
    for path in (ROOT / "data" / "tinyshakespeare.txt", ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"):
        if path.exists():
            return path
    pytest.skip("data/tinyshakespeare.txt is missing (CI copies it from ../shared/data)")


@pytest.fixture(scope="session")
def shakespeare_head(tmp_path_factory, shakespeare_path) -> Path:
    """The first 60 kB of Tiny Shakespeare in a file of its own: real text, quick to tokenize."""
    path = tmp_path_factory.mktemp("corpus") / "shakespeare_head.txt"
    path.write_text(shakespeare_path.read_text(encoding="utf-8")[:60_000], encoding="utf-8")
    return path


def llama_like_byte_fallback_tokenizer():
    """A SentencePiece-style BPE as Llama and Mistral ship it: characters outside the vocabulary
    become <0x..> byte tokens, which ByteFallback decodes a run at a time."""
    from tokenizers import Tokenizer as Backend, decoders, models, normalizers

    from tinyattn.data.tokenizer import Tokenizer

    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    pieces = ["<unk>", "<s>", "</s>"] + byte_tokens + ["▁", "a", "b", "▁a", "▁b", "ab"]
    backend = Backend(models.BPE(vocab={piece: i for i, piece in enumerate(pieces)},
                                 merges=[("▁", "a"), ("▁", "b"), ("a", "b")], unk_token="<unk>",
                                 byte_fallback=True, fuse_unk=True))
    backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                         decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    return Tokenizer.from_json(backend.to_str(), end_of_text="</s>", start_of_text="<s>")


def corpus_items(corpus: Path, cache_dir: Path) -> list[str]:
    """--set items that read the local file `corpus` (no download), its token cache in cache_dir."""
    return [f"data.files={corpus}", "data.url=null", "data.sha256=null", f"data.cache_dir={cache_dir}"]


def local_corpus(corpus: Path, out_dir: Path) -> list[str]:
    """--set items that train on the local file `corpus` (no download) with caches and runs in out_dir."""
    return [*corpus_items(corpus, out_dir / "cache"), f"train.out_dir={out_dir}"]


def written_corpus(tmp_path: Path, text: str | None = None) -> list[str]:
    """`corpus_items` of `text` (None: CORPUS) written to tmp_path/corpus.txt, the cache in
    tmp_path/cache (no train.out_dir: a lab's folder is its --out)."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(CORPUS if text is None else text, encoding="utf-8")
    return corpus_items(corpus, tmp_path / "cache")


def run_started_in(corpus: Path, tmp_path: Path, monkeypatch, *extra: str) -> tuple[Path, list[str]]:
    """A tiny run started in tmp_path/start on its data/corpus.txt with its token cache in data/cache,
    both named relatively (the run folder is tmp_path/runs/run), stopped at step 4 of 8; returns the
    start folder and the run's --set items. The test is left in the start folder."""
    from tinyattn.config import load_config
    from tinyattn.train.loop import train

    start = tmp_path / "start"
    (start / "data").mkdir(parents=True)
    shutil.copy(corpus, start / "data" / "corpus.txt")
    items = ["data.files=[data/corpus.txt]", "data.url=null", "data.sha256=null", "data.cache_dir=data/cache",
             f"train.out_dir={tmp_path / 'runs'}", "train.max_steps=8", "train.eval_interval=4", *extra]
    monkeypatch.chdir(start)
    train(load_config(ROOT / "configs" / "tiny.yaml", items), run_name="run", progress=False, stop_at_step=4)
    return start, items


def chromium_executable():
    """Debian's chromium (or TINYATTN_CHROMIUM); None: Playwright's own browser, if installed."""
    named = os.environ.get("TINYATTN_CHROMIUM")
    if named:
        return named
    return next((shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome")
                 if shutil.which(name)), None)


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium through Playwright for the explorer's and the playground's pages; skipped
    where there is none, except in CI, whose .ci/run installs it."""
    playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed "
                                         "(pip install -e '.[dev]')")
    with playwright_api.sync_playwright() as p:
        try:
            launched = p.chromium.launch(executable_path=chromium_executable())
        except Exception as e:  # no browser on this machine
            reason = (f"no Chromium to run the pages in (apt-get install chromium, or "
                      f"python -m playwright install chromium): {str(e).splitlines()[0]}")
            if os.environ.get("CI"):
                pytest.fail(reason + "; .ci/run installs it, so CI must have it")
            pytest.skip(reason)
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def browser_context(browser):
    """One browser context for a module's pages: opening a context costs more than a page in it.

    The pages share its cookies, storage and cache, which none of the explorer's or playground's
    pages use (each page is a new document either way)."""
    context = browser.new_context()
    yield context
    context.close()


@pytest.fixture
def new_page(browser, browser_context):
    """new_page(viewport=None, own_cache=False) -> a new page of its own (document, listeners, history,
    focus and keyboard), as browser.new_page gives, in the module's browser context; closed after the
    test. own_cache: in a context of its own, for a test of what the page requests: a resource an
    earlier page cached would load without a request event."""
    pages = []

    def make(viewport=None, own_cache=False):
        page = browser.new_page() if own_cache else browser_context.new_page()
        pages.append(page)
        if viewport is not None:
            page.set_viewport_size(viewport)
        return page

    yield make
    for page in pages:
        page.close()


@pytest.fixture(autouse=True, scope="session")
def private_cache_dir(tmp_path_factory):
    """The CPU verdict cache (tinyattn.cpu) goes to a temporary folder, never ~/.cache."""
    os.environ["TINYATTN_CACHE_DIR"] = str(tmp_path_factory.mktemp("tinyattn_cache"))
    yield


# ----------------------------------------------------------------------------- shared models and runs

# Text every shared tokenizer and the shared run are built from: the lines the generation,
# evaluation and attention-map tests prompt with, repeated so a tiny model can learn them.
# The run's validation split is the last tenth: lines the training split repeats.
CORPUS = (("The book that the student borrowed from the library was fascinating.\n"
           "ROMEO:\nBut soft, what light through yonder window breaks? It is the east.\n") * 4
          + ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
             "First Citizen:\nYou are all resolved rather to die than to famish?\n\n") * 12)


@pytest.fixture
def no_fsync(monkeypatch):
    """os.fsync does nothing during the test: files and renames reach the page cache, not the disk.

    For the files that train a run in process (each run fsyncs every file it writes and the folder
    of each rename, milliseconds apiece on a real disk): what an fsync adds shows only after a power
    loss or a kernel crash, which no test here makes. A killed process loses nothing the page cache
    holds, so the tests of kills and cut-short saves see the same files. test_run_folder pins that a
    write is fsynced before its rename and the folder after it; the real processes a test starts
    (warm_python's forks, torchrun's ranks) fsync as ever.
    """
    monkeypatch.setattr(os, "fsync", lambda fd: None)


@pytest.fixture(scope="session")
def corpus_text() -> str:
    return CORPUS


@pytest.fixture(scope="session")
def char_tokenizer():
    """A character-level tokenizer of CORPUS: every character of the test prompts but 'é' and 'ü'."""
    from tinyattn.config import TokenizerConfig
    from tinyattn.data.tokenizer import build_tokenizer

    return build_tokenizer(TokenizerConfig(kind="char"), lambda: iter([CORPUS]))


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def device(request) -> str:
    """Each device a test means something on: the CPU always, CUDA when there is a GPU.

    The CUDA half is marked `cuda` (benchmarks/gpu_check.sh runs `pytest -m cuda` on a GPU) and
    skipped without one, so the CPU half of every such test runs everywhere.
    """
    import torch

    if request.param == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (benchmarks/gpu_check.sh runs these on one)")
    return request.param


@pytest.fixture(scope="session")
def tiny_model():
    """Builds the tests' tiny model in eval mode: tiny_model(seed=0, **ModelConfig overrides).

    Two layers of width 32, four query heads, four key/value heads (give n_kv_head for
    grouped queries), context 24, a vocabulary of 65; the seed fixes the initial weights.
    """
    import torch

    from tinyattn.config import ModelConfig
    from tinyattn.model.transformer import LanguageModel

    def build(seed: int = 0, **overrides):
        torch.manual_seed(seed)
        options = dict(vocab_size=65, n_layer=2, n_head=4, n_kv_head=4, n_embd=32, context_length=24)
        options.update(overrides)
        return LanguageModel(ModelConfig(**options)).eval()

    return build


@pytest.fixture(scope="session")
def random_tokens():
    """random_tokens(batch=2, length=24, seed=1, vocab_size=65): ids (batch, length), fixed by the seed."""
    import torch

    def draw(batch: int = 2, length: int = 24, seed: int = 1, vocab_size: int = 65):
        return torch.randint(0, vocab_size, (batch, length), generator=torch.Generator().manual_seed(seed))

    return draw


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory):
    """A run folder written by `tinyattn.train.loop.train` itself: configs/tiny.yaml, 30 steps on CORPUS.

    Built once per session; tests read it (and may add files of their own names to it).
    Returns the TrainResult; `.run_dir` holds best.pt, step checkpoints, config.yaml and
    tokenizer.json exactly as a real run leaves them.
    """
    from tinyattn.config import load_config
    from tinyattn.train.loop import train

    folder = tmp_path_factory.mktemp("trained_run")
    corpus = folder / "corpus.txt"
    corpus.write_text(CORPUS, encoding="utf-8")
    config = load_config(ROOT / "configs" / "tiny.yaml", [
        f"data.files={corpus}", "data.url=null", "data.sha256=null", f"data.cache_dir={folder / 'cache'}",
        f"train.out_dir={folder / 'runs'}", "train.max_steps=30", "train.eval_interval=30",
        "train.batch_size=8", "train.lr=1e-2", "train.min_lr=1e-3", "train.sample_tokens=0"])
    return train(config, run_name="tiny", progress=False)


class TrainStepCounter:
    """How many times Trainer.train_step ran since it was patched in: the steps a run really took."""

    def __init__(self, monkeypatch):
        from tinyattn.train.trainer import Trainer

        self.calls = 0
        original = Trainer.train_step

        def counted(trainer):
            self.calls += 1
            return original(trainer)

        monkeypatch.setattr(Trainer, "train_step", counted)


@pytest.fixture
def count_train_steps(monkeypatch):
    """count_train_steps() -> a counter of the Trainer.train_step calls from then on (`.calls`)."""
    return lambda: TrainStepCounter(monkeypatch)


class RecordingWriter:
    """Stands in for TensorBoard's SummaryWriter: records what is added, per instance."""

    def __init__(self):
        self.scalars: list[tuple] = []  # (tag, value, step)
        self.images: list[tuple] = []  # (tag, image, step, dataformats)
        self.texts: list[tuple] = []  # (tag, text, step)

    def add_scalar(self, tag, value, step):
        self.scalars.append((tag, value, step))

    def add_image(self, tag, image, step, dataformats="CHW"):
        self.images.append((tag, image, step, dataformats))

    def add_text(self, tag, text, step):
        self.texts.append((tag, text, step))

    def close(self):
        pass


@pytest.fixture
def tensorboard_writer() -> RecordingWriter:
    return RecordingWriter()


@pytest.fixture
def drawn_figures(monkeypatch) -> list:
    """The matplotlib figures `plotting.new_figure` makes during the test: what a PNG shows."""
    from tinyattn.analysis import plotting

    made, real = [], plotting.new_figure
    monkeypatch.setattr(plotting, "new_figure", lambda *args, **kwargs: made.append(real(*args, **kwargs))
                        or made[-1])
    return made


@pytest.fixture
def figures_unrendered(monkeypatch) -> list:
    """The matplotlib figures `plotting.new_figure` makes during the test, each saved as an empty file
    at its path rather than rendered: for tests that read what a figure holds (its lines, labels,
    ticks, legend) and none of its pixels. Laying out and rendering a figure of log axes is most of
    such a test's time; each figure is still rendered whole by a test that runs its command or
    draws it with `drawn_figures`."""
    from tinyattn.analysis import plotting

    return unrendered_figures(monkeypatch, plotting)


def unrendered_figures(monkeypatch, module) -> list:
    """`figures_unrendered` for the figures `module.new_figure` makes (a module that imported it by
    name): the list they go to."""
    made, real = [], module.new_figure

    def new_figure(*args, **kwargs):
        figure = real(*args, **kwargs)
        figure.savefig = lambda path, *more, **options: Path(path).touch()
        made.append(figure)
        return figure

    monkeypatch.setattr(module, "new_figure", new_figure)
    return made


def lines_by_label(axes) -> dict:
    """{label: (x, y)} of the lines drawn on a matplotlib axes, as lists."""
    return {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in axes.lines}


class SmallDisk(type(Path())):
    """A mounted tmpfs path that can be remounted read-only (read-only even for root)."""

    def make_read_only(self) -> None:
        subprocess.run(["mount", "-o", "remount,ro", str(self)], check=True)


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 256 KiB tmpfs: a disk that fills, and can be made read-only. Needs root (CI runs as
    root); skipped with the reason elsewhere."""
    mount_point = SmallDisk(tmp_path / "disk")
    mount_point.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (CI runs as root)")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount_point)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    yield mount_point
    subprocess.run(["umount", "-l", str(mount_point)], check=False)
