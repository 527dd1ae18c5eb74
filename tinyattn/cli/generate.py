"""`tinyattn generate` (`scripts/generate.py`): sample text from a checkpoint, streamed as it is produced.

Parses the arguments, loads the checkpoint, checks the sampling options once
(`SamplingOptions`) and streams `tinyattn.generate.text.stream_samples`.
What goes where:

- stdout: the prompt, then the generated text, flushed token by token, then a newline if
  the text did not end with one. With `--num-samples N > 1`, each sample is preceded by a
  `--- sample i/N ---` line; the samples are decoded together as one batch, sample 1 streams
  live and each later one follows as soon as the ones before it have ended (its text so far
  at once, then live). A stop string or the end-of-text token ends a sample and is not
  printed.
- stderr: one line saying which checkpoint was loaded, warnings about the prompt
  (`warning: ...`), and errors (`error: ...`, exit status 2, no traceback; a stdout that cannot
  take the text, a full disk, is one of them).

Ctrl-C or SIGTERM stops at once: the partial text ends its line, and `interrupted` (or
`stopped by SIGTERM`) is the last line, exit status 130.

`--interactive` reads one prompt per line from stdin until end of input (Ctrl-D) and prints
each continuation, ending its line (an empty continuation is an empty line; with --num-samples,
each sample's under its header); the prompt itself
is not echoed there. A line that is not text in stdin's encoding, or holds a NUL (UTF-16 read
as UTF-8), is skipped with a warning naming its line number (its answer an empty line), and the
session goes on.
"""

from __future__ import annotations

import argparse
import itertools
import re
import sys
import warnings
from contextlib import suppress
from typing import Optional

from tinyattn.cli import point_at_null, run_command, warnings_as_lines
from tinyattn.cli.options import add_checkpoint, add_device, add_inference_dtype, add_out_dir, command_parser
from tinyattn.config import home_path
from tinyattn.errors import ConfigError, DataError, StorageError, parameter_count_text
from tinyattn.system.signals import sigterm_interrupts
from tinyattn.system.storage import BYTE_ORDER_MARK, byte_order_advice, nul_found

DESCRIPTION = """\
Generate text from a trained tinyattn checkpoint, streamed to stdout as it is produced.

The prompt comes from --prompt, --prompt-file FILE, or stdin ("-"); without any of them,
the checkpoint's configured prompt (sample.prompt, empty by default) is used. An empty
prompt starts from the end-of-text token, or an imported Hugging Face folder's bos (a
newline for tokenizers without either); an imported folder whose tokenizer puts its bos
before a text puts it before the prompt too. A prompt longer than the model's context keeps
its end (with a warning); characters a character-level tokenizer never saw become [UNK]
(with a warning naming them).

Sampling options not given default to the checkpoint's saved `sample` config. Temperature 0
is greedy decoding. --seed N fixes the text: sample i (from 1) of --num-samples uses seed
N + i - 1 (past 2**63 - 1 it wraps to 0, 1, ...), so each sample equals the single sample of a
run with that seed (exactly in fp32; in bf16, or with the fp16 copies --dtype auto keeps on
some CPUs, a batch's products round differently from one sequence's, and a long sample can
part from the single run).

Past the model's context length, generation goes on: when the context is full, the last
context_length // 2 tokens are re-read (positions restart at 0) and decoding continues.
"""

EPILOG = """\
examples:
  tinyattn generate --prompt "ROMEO:" --max-new-tokens 300
  tinyattn generate --checkpoint checkpoints/shakespeare_char --temperature 0
  tinyattn generate --prompt "To be" --num-samples 3 --seed 1 --stop "\\n\\n"
  echo "JULIET:" | tinyattn generate -
  tinyattn generate --interactive
"""


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("generate", DESCRIPTION, EPILOG,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    add_checkpoint(parser, where="--out-dir")
    add_out_dir(parser)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--prompt", metavar="TEXT", help="the text to continue")
    source.add_argument("--prompt-file", type=home_path, metavar="FILE",
                        help="read the prompt from a UTF-8 file ('-': stdin)")
    source.add_argument("stdin", nargs="?", choices=["-"], default=None, metavar="-",
                        help="read the prompt from stdin")
    source.add_argument("--interactive", action="store_true",
                        help="read prompts from stdin, one per line, until end of input; each "
                             "answer ends its line, an empty one too")
    _add_sampling_options(parser)
    add_device(parser)
    add_inference_dtype(parser)
    parser.add_argument("--compile", action="store_true",
                        help="compile the one-token decoding step with torch.compile: the same "
                             "text as eager fp32, faster per token, after a compile of seconds (tens "
                             "of seconds the first time on a machine); worth it for long generations")
    return parser


def _add_sampling_options(parser: argparse.ArgumentParser) -> None:
    """The `SamplingOptions` fields as options; those not given default to the checkpoint's."""
    parser.add_argument("--max-new-tokens", type=int, metavar="N", help="tokens to generate per sample")
    parser.add_argument("--temperature", type=float, metavar="T", help="0 is greedy; higher is more random")
    parser.add_argument("--top-k", type=int, metavar="K",
                        help="sample among the K most likely tokens (0: off)")
    parser.add_argument("--top-p", type=float, metavar="P",
                        help="sample among the fewest most likely tokens whose probability "
                             "reaches P (1: off)")
    parser.add_argument("--repetition-penalty", type=float, metavar="R",
                        help="make tokens already in the text less likely (CTRL-style; 1: off)")
    parser.add_argument("--num-samples", type=int, default=1, metavar="S",
                        help="samples decoded together as one batch (default: 1)")
    parser.add_argument("--seed", type=int, metavar="N", help="fix the random draws (default: a fresh seed)")
    # One string per --stop (not nargs="+"), so a "-" after it is the stdin prompt, not a stop string.
    parser.add_argument("--stop", action="append", default=[], metavar="STRING",
                        help="end a sample where this string appears (not printed); Python escapes "
                             "such as \\n, \\t, \\\\ and \\u00e9 are understood (a backslash before "
                             "anything else stays); give --stop again for each further string")


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    with sigterm_interrupts("stopped by SIGTERM"):
        return run_command(lambda: run(args))


def run(args: argparse.Namespace) -> int:
    # Heavy imports here, so --help and argument errors answer without loading a model.
    from tinyattn.checkpoint import require_causal
    from tinyattn.generate.text import PromptWarning
    from tinyattn.hf.folder import load_any_model
    from tinyattn.system.device import select_device

    stop = [unescape(s) for s in args.stop]
    check_sampling_flags(args, stop)
    device = select_device(args.device)
    _check_stdin(args)
    prompt = None if args.interactive else read_prompt(args)
    loaded = load_any_model(args.checkpoint, device, args.out_dir)
    require_causal(loaded, "tinyattn generate")
    options = sampling_options(args, loaded.config.sample, stop)  # the one check, before any output
    model = inference_model(loaded, args, device)
    out = StreamPrinter(sys.stdout, model, loaded.tokenizer, options, compile=args.compile)
    with warnings_as_lines():
        warnings.simplefilter("always", PromptWarning)
        if not args.interactive:
            out.run(_given(prompt, loaded.config.sample.prompt), echo=True)
            return 0
        return _interactive(out)


SAMPLING_FLAGS = ("max_new_tokens", "temperature", "top_k", "top_p", "repetition_penalty", "num_samples",
                  "seed")  # the SamplingOptions fields typed as options (--stop is a list, checked apart)


def check_sampling_flags(args: argparse.Namespace, stop: list[str]) -> None:
    """The sampling options typed, checked before the model loads; a refused one is named as typed."""
    from tinyattn.config import check_sampling

    def fail(name, value, accepted):
        raise ConfigError(f"--{name.replace('_', '-')} {value!r} is not accepted: expected {accepted}")

    check_sampling(fail, stop=stop, **{name: getattr(args, name) for name in SAMPLING_FLAGS})


def sampling_options(args: argparse.Namespace, saved, stop: list[str]):
    """The call's `SamplingOptions`: each option given on the command line, else the checkpoint's."""
    from tinyattn.generate.sampling import SamplingOptions

    return SamplingOptions(
        max_new_tokens=_given(args.max_new_tokens, saved.max_new_tokens),
        temperature=_given(args.temperature, saved.temperature), top_k=_given(args.top_k, saved.top_k),
        top_p=_given(args.top_p, saved.top_p),
        repetition_penalty=_given(args.repetition_penalty, saved.repetition_penalty),
        num_samples=args.num_samples, seed=args.seed, stop=tuple(stop))


def inference_model(loaded, args: argparse.Namespace, device):
    """The loaded model in the --dtype, its weights packed for the CPU; says so on stderr."""
    from tinyattn.generate.decoder import prepare_for_generation

    prepared = prepare_for_generation(loaded.model, args.dtype, device, compile=args.compile)
    size = prepared.model.num_parameters()
    print(f"{loaded.label}: {parameter_count_text(size)} parameters, "
          f"{prepared.describe(device)}{', compiled decoding' if args.compile else ''}",
          file=sys.stderr)
    return prepared.model


def _interactive(out: "StreamPrinter") -> int:
    """--interactive: one prompt per line from stdin until end of input; prompts not echoed.

    A line that is not text in stdin's encoding is skipped with a warning and answered with an empty
    line, as an empty continuation is: the session goes on, one answer line per prompt line.
    """
    interactive = sys.stdin.isatty()
    for number in itertools.count(1):
        if interactive:
            print("> ", end="", file=sys.stderr, flush=True)
        line = _read_line(number)
        if line is None:  # end of input
            if interactive:
                print(file=sys.stderr)
            return 0
        if line is _SKIPPED:  # an empty answer's line: answers stay one line per prompt line
            out.empty_answer()
        else:
            out.run(line.rstrip("\r\n").removeprefix(BYTE_ORDER_MARK if number == 1 else ""), echo=False)


_SKIPPED = object()  # what _read_line returns for a line it could not decode


def _read_line(number: int):
    """stdin's next line (None at the end); read as bytes and decoded here, so one undecodable
    line costs only itself (a text stream's decoder would fail for the rest of its buffer). A line
    holding a NUL, which no text does, is skipped as one that does not decode."""
    buffer = getattr(sys.stdin, "buffer", None)
    if buffer is None:  # already text (a StringIO in tests): nothing can fail to decode
        return sys.stdin.readline() or None
    raw = buffer.readline()
    if not raw:
        return None
    encoding = sys.stdin.encoding or "utf-8"
    try:
        line = raw.decode(encoding)
    except UnicodeDecodeError as e:
        return _skip_line(number, f"is not {encoding} text ({e.reason} at byte {e.start})")
    if "\0" in line:  # as a prompt file's and a whole stdin prompt's: UTF-16 read as UTF-8
        nul = raw.find(b"\0")
        return _skip_line(number, nul_found("", f"at byte {nul}"))
    return line


def _skip_line(number: int, why: str):
    """The warning for stdin's line `number`, which `_read_line` skips; `_SKIPPED`."""
    print(f"warning: stdin line {number} {why}; skipped", file=sys.stderr, flush=True)
    return _SKIPPED


class StreamPrinter:
    """Writes pieces as they come, with a header line before each sample when there are several."""

    def __init__(self, stream, model, tokenizer, options, *, compile: bool = False):
        self.stream = stream
        self.model, self.tokenizer, self.options, self.compile = model, tokenizer, options, compile
        self.num_samples = options.num_samples
        self.at_line_start = True
        self.wrote = False  # anything written for the prompt being answered

    def write(self, text: str) -> None:
        if text:
            try:
                self.stream.write(text)
                self.stream.flush()
            except BrokenPipeError:
                raise  # the reader went away (`| head`): `run_command` ends quietly
            except OSError as e:  # a full disk, an I/O error: one line, not a traceback
                point_at_null(self.stream)  # the text still buffered would fail again at exit
                raise StorageError(f"stdout: cannot write the generated text ({e.strerror or e})") from None
            self.at_line_start, self.wrote = text.endswith("\n"), True

    def end_line(self) -> None:
        if not self.at_line_start:
            self.write("\n")

    def end_sample(self, echo: bool) -> None:
        """Ends a sample's line; in --interactive (no echo) an empty sample is an empty line, so the
        answers stay one line per sample (`self.wrote`: anything written since its header)."""
        self.end_line()
        if not (echo or self.wrote):
            self.write("\n")

    def empty_answer(self) -> None:
        """A skipped --interactive line's answer: each sample's header, if several, and an empty line."""
        for sample in range(self.num_samples):
            self.sample_header(sample)
            self.write("\n")

    def sample_header(self, sample: int) -> None:
        """`--- sample i/N ---` on a line of its own, where several samples are asked for."""
        if self.num_samples > 1:
            self.end_line()
            self.write(f"--- sample {sample + 1}/{self.num_samples} ---\n")
            self.wrote = False  # the sample's own text, from here

    def run(self, prompt: str, echo: bool) -> None:
        from tinyattn.generate.text import stream_samples

        pieces = stream_samples(self.model, self.tokenizer, prompt, self.options, compile=self.compile)
        started, self.wrote = -1, False
        try:
            for piece in pieces:
                if piece.sample != started:  # first piece of a sample
                    if started >= 0:
                        self.end_sample(echo)
                    started = piece.sample
                    self.sample_header(piece.sample)
                    if echo:
                        self.write(prompt)
                self.write(piece.text)
        except KeyboardInterrupt:  # Ctrl-C, SIGTERM: the partial text ends its line, then the message
            with suppress(OSError, StorageError):
                self.end_line()
            raise
        self.end_sample(echo)  # --interactive: an empty answer is an empty line, one line per prompt


def _check_stdin(args: argparse.Namespace) -> None:
    """A prompt to read from stdin where the process has none (`<&-`, a service's closed stdin):
    one line, before the model loads."""
    given = "--interactive" if args.interactive else _stdin_prompt_flag(args)
    if sys.stdin is not None or given is None:
        return
    what = "prompts" if args.interactive else "the prompt"
    raise DataError(f"{given} reads {what} from stdin, which is closed; give the prompt with --prompt TEXT "
                    "or --prompt-file FILE")


def _stdin_prompt_flag(args: argparse.Namespace) -> Optional[str]:
    """How the prompt was asked for from stdin, "-" or "--prompt-file -"; None: not from stdin."""
    if args.stdin == "-":
        return "-"
    return "--prompt-file -" if args.prompt_file == "-" else None


def read_prompt(args: argparse.Namespace) -> Optional[str]:
    """The prompt text from --prompt, --prompt-file or stdin; None when none was given."""
    from tinyattn.system.storage import read_text, refuse_nul

    if args.prompt is not None:
        return args.prompt
    if _stdin_prompt_flag(args) is not None:
        buffer = getattr(sys.stdin, "buffer", None)  # none where stdin is already text (a test's StringIO)
        text = read_stdin(sys.stdin.read if buffer is None else buffer.read)
        refuse_nul(text, "stdin", "prompt")  # as read_text refuses it in a file: UTF-16 read as UTF-8
        return text.removeprefix(BYTE_ORDER_MARK)  # as read_text drops it from a file
    if args.prompt_file is not None:
        return read_text(args.prompt_file, "prompt file")
    return None


def read_stdin(read) -> str:
    """All of stdin, the prompt, from `read` (its bytes, or its text), decoded here in stdin's encoding
    and read as --prompt-file reads a file: strictly, where Python's stdin escapes the bytes it cannot
    decode under the C and C.UTF-8 locales (which surfaced later as lone surrogates), and with \\r\\n
    and a lone \\r read as \\n, which Python's stdin translates on Windows only."""
    encoding = sys.stdin.encoding or "utf-8"
    try:
        data = read()
        text = data.decode(encoding) if isinstance(data, bytes) else data
    except UnicodeDecodeError as e:
        raise DataError(f"stdin: the prompt is not {encoding} text ({e.reason}){byte_order_advice(e.object)}"
                        ) from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


# Python's escape sequences: \\ \' \" \a \b \f \n \r \t \v, octal \ooo, \xhh, \uXXXX, \UXXXXXXXX,
# \N{name}, and a backslash before a newline. The digits are optional here so that "\x" alone is
# found, and refused, as Python refuses it.
ESCAPE_SEQUENCE = re.compile(r"\\(?:[\\'\"abfnrtv\n]|[0-7]{1,3}|x[0-9a-fA-F]{0,2}|u[0-9a-fA-F]{0,4}"
                             r"|U[0-9a-fA-F]{0,8}|N(?:\{[^}]*\}?)?)")


def unescape(text: str) -> str:
    r"""Python's escape sequences in a command-line string ("\n" -> newline, "\u00e9" -> "é");
    every other character, a backslash before one that starts no escape ("\日") included, as typed."""
    def decoded(match: re.Match) -> str:
        try:
            return match[0].encode("ascii").decode("unicode_escape")
        except UnicodeError as e:  # "\x" without its digits; a "\N{name}" Python does not know
            raise ConfigError(f"--stop {text!r}: not a valid escape sequence ({match[0]}: {e.reason}); "
                              f"escapes such as \\n, \\t, \\\\ and \\u00e9 are understood") from None
    return ESCAPE_SEQUENCE.sub(decoded, text)


def _given(value, default):
    return default if value is None else value
