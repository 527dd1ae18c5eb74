"""The wire format of `tinyattn serve`: request models, the server's limits, OpenAI-style errors.

A request body is parsed here and nowhere else (`parse_completion`, `parse_explore`): JSON
that does not parse, a field this server does not know, a value of the wrong type or out of
range all become an `ApiError`, which the app answers with a 400 and OpenAI's error body
`{"error": {"message", "type", "param", "code"}}`. The sampling rules are the project's own
(`tinyattn.config.check_sampling`, what `tinyattn generate` and `SamplingOptions` apply),
so the server accepts exactly what the library does, within the server's `Limits`.

Fields of OpenAI's completions API that this server does not implement (echo, logprobs,
best_of, suffix, the frequency and presence penalties, logit_bias) are accepted only at
their "off" values (a logit_bias of zeros is one), so a client that sends the defaults
works and one that asks for the feature is told it is not supported. `top_k` and
`repetition_penalty` are tinyattn's additions (vLLM accepts the same names).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Union, get_args

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from tinyattn.config import SampleConfig, check_sampling
from tinyattn.errors import counted

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


class ApiError(Exception):
    """An error answered with OpenAI's error body; `status` is the HTTP status."""

    def __init__(self, message: str, *, status: int = 400, type: str = "invalid_request_error",
                 param: Optional[str] = None, code: Optional[str] = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class Limits:
    """What one request may ask for; beyond it, a 400 naming the limit."""

    max_tokens: int = 1024  # new tokens per choice
    max_prompt_tokens: Optional[int] = None  # None: the model's context length
    max_n: int = 8  # choices per request (decoded together as one batch)
    max_stop: int = 4  # stop strings per request (OpenAI's limit)
    max_explore_tokens: int = 256  # tokens of a text the explorer route measures
    max_active: int = 4  # requests decoding at once, taking turns token by token
    max_waiting: int = 64  # requests queued behind them; beyond: 429
    max_body_bytes: int = 16 << 20  # a request body (far beyond any prompt a context reads); beyond: 413


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    include_usage: bool = False


class CompletionRequest(BaseModel):
    """The body of POST /v1/completions (OpenAI's fields; None: not given)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str
    prompt: Union[str, list[str]] = ""
    max_tokens: Optional[int] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    repetition_penalty: Optional[float] = None
    stop: Union[str, list[str], None] = None
    seed: Optional[int] = None
    n: Optional[int] = None
    stream: Optional[bool] = False
    stream_options: Optional[StreamOptions] = None
    user: Optional[str] = None  # accepted and ignored, as OpenAI's own is only for abuse monitoring
    # Accepted only at their "off" values (OFF_VALUES).
    echo: Optional[bool] = None
    logprobs: Optional[int] = None
    best_of: Optional[int] = None
    suffix: Optional[str] = None
    frequency_penalty: Optional[float] = None
    presence_penalty: Optional[float] = None
    logit_bias: Optional[dict[str, float]] = None

    @field_validator("logit_bias")
    @classmethod
    def _zeros_bias_nothing(cls, biases: Optional[dict[str, float]]) -> Optional[dict[str, float]]:
        """OpenAI's neutral bias, 0 for some tokens (a client's map set back to zeros), biases none: {}."""
        return {} if biases and all(bias == 0 for bias in biases.values()) else biases


OFF_VALUES = {"echo": (None, False), "logprobs": (None,), "suffix": (None, ""),
              "frequency_penalty": (None, 0), "presence_penalty": (None, 0), "logit_bias": (None, {})}


# What a field typed as a union takes, for its 400 (OpenAI's prompt may also be token ids: not here).
UNION_FIELDS = {"prompt": "text: a string, or a list of one string (token ids are not taken)",
                "stop": "a string or a list of strings"}


class ExploreRequest(BaseModel):
    """The body of POST /explorer: a text and a character of it (the token holding it is shown)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    text: str
    offset: int  # a character of text, counted in code points (as a Python str), not UTF-16 units
    # The text was generated from an empty prompt: it is read after the start token generation began from.
    empty_prompt: bool = False


def validation_error(e: ValidationError, model: type[BaseModel]) -> ApiError:
    """The first problem pydantic found in a `model` body, as one OpenAI-style 400 naming the field
    by its path (`stream_options.include_usage`)."""
    first = e.errors()[0]
    kind, loc = first["type"], _field_path(model, [str(part) for part in first["loc"]])
    param = ".".join(loc) if loc else None
    if kind == "json_invalid":
        return ApiError(f"the request body is not valid JSON: {first['msg']}", code="invalid_json")
    if kind == "extra_forbidden":
        return ApiError(f"unknown field {param!r}", param=param, code="unknown_field")
    if kind == "missing":
        return ApiError(f"the field {param!r} is required", param=param, code="missing_field")
    if not loc:
        return ApiError(f"the request body must be a JSON object: {first['msg']}")
    if loc[0] in UNION_FIELDS:  # pydantic names one member of the union ("a valid string"): say them all
        return ApiError(f"{loc[0]}: expected {UNION_FIELDS[loc[0]]}", param=loc[0])
    return ApiError(f"{param}: {first['msg']}", param=param)


def _field_path(model: type[BaseModel], loc: list[str]) -> list[str]:
    """`loc` less the member pydantic names after a field typed as a union of several types
    (`prompt`, `str`), which is no part of the request; a nested model's field stays."""
    field = model.model_fields.get(loc[0]) if loc else None
    if field is None or len(loc) < 2:
        return loc
    members = [t for t in get_args(field.annotation) if t is not type(None)]
    return loc[:1] + loc[2:] if len(members) > 1 else loc


def parse(model: type[BaseModel], body: bytes) -> Any:
    # JSON parsers may ignore a leading byte-order mark (RFC 8259), which a body sent from a file saved
    # by a Windows editor starts with: it read "not valid JSON: expected value at line 1 column 1".
    body = body.removeprefix(b"\xef\xbb\xbf")
    if not body.strip():  # a client that sends no Content-Length (nor chunks) sends no body
        raise ApiError("the request body is empty: expected a JSON object of the request's fields (was it "
                       "sent without a Content-Length?)", code="invalid_json")
    try:
        return model.model_validate_json(body)
    except ValidationError as e:
        if e.errors()[0]["type"] == "json_invalid":
            _refuse_a_lone_surrogate(body)
        raise validation_error(e, model) from None


def _refuse_a_lone_surrogate(body: bytes) -> None:
    """JSON may escape half of a UTF-16 surrogate pair (a \\ud800 escape; Python's json writes one for
    such a str), which pydantic's parser calls invalid JSON: the 400 names the field and the character."""
    import json

    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return  # invalid JSON indeed
    if not isinstance(value, dict):  # a list or a string: said as of any body that is no object
        raise ApiError("the request body must be a JSON object: Input should be an object")
    for path, text, is_key in _strings_in(value, []):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            name = ".".join(path) or None
            # A key is named by the object that holds it: the key itself cannot be written back as UTF-8.
            where = f"a key of {name or 'the request body'}" if is_key else name
            raise ApiError(f"{where}: not valid Unicode text after {counted(e.start, 'character')} (half "
                           "of a UTF-16 surrogate pair)", param=name) from None


def _strings_in(value, path: list[str]):
    """(path, str, is_key) for every string in a parsed JSON value, values and an object's keys alike:
    a value's path of keys and indices to it, or a key's path to the object that holds it."""
    if isinstance(value, str):
        yield path, value, False
    members = (value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list)
               else ())
    for key, member in members:
        if isinstance(key, str):
            yield path, key, True
        yield from _strings_in(member, path + [str(key)])


# ----------------------------------------------------------------------------- a completion request


@dataclass(frozen=True)
class Completion:
    """A checked completion request: what `tinyattn.generate.text.stream_samples` is called with."""

    prompt: str
    prompt_tokens: int
    options: Any  # tinyattn.generate.sampling.SamplingOptions
    stream: bool
    include_usage: bool
    # What the client should know of how its prompt was read (characters read as [UNK]), as the
    # commands warn on stderr: the answer's `warnings` (a stream's first chunk's).
    warnings: tuple[str, ...] = ()


def _fail(name: str, value, accepted: str):
    raise ApiError(f"{name} {value!r} is not accepted: expected {accepted}", param=name)


def _prompt_of(request: CompletionRequest) -> str:
    prompt = request.prompt
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise ApiError(f"prompt: this server takes one prompt per request, got a list of {len(prompt)}"
                           " (ask for several continuations of one prompt with n)", param="prompt")
        prompt = prompt[0]
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as e:  # a lone surrogate, which JSON's \ud800 escapes can carry
        raise ApiError(f"prompt: not valid Unicode text after {counted(e.start, 'character')}",
                       param="prompt") from None
    return prompt


def _stop_of(request: CompletionRequest, limits: Limits) -> tuple[str, ...]:
    stop = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
    if len(stop) > limits.max_stop:
        raise ApiError(f"stop: at most {limits.max_stop} stop strings, got {len(stop)}", param="stop")
    return tuple(stop)


def _refuse_unsupported(request: CompletionRequest, n: int) -> None:
    for name, off in OFF_VALUES.items():
        if getattr(request, name) not in off:
            raise ApiError(f"{name} is not supported by tinyattn serve (send it unset)", param=name,
                           code="unsupported_parameter")
    if request.best_of not in (None, n):
        raise ApiError("best_of is not supported by tinyattn serve (send it unset, or equal to n)",
                       param="best_of", code="unsupported_parameter")


def check_completion(request: CompletionRequest, *, limits: Limits, defaults: SampleConfig, tokenizer,
                     context_length: int) -> Completion:
    """The request checked against the sampling rules and `limits`; options not given: `defaults`."""
    from tinyattn.generate.sampling import SamplingOptions

    n = 1 if request.n is None else request.n
    if not 1 <= n <= limits.max_n:
        raise ApiError(f"n {n} is not accepted: expected 1 to {limits.max_n}", param="n")
    _refuse_unsupported(request, n)
    if request.stream_options is not None and not request.stream:  # as OpenAI's API refuses it
        raise ApiError("stream_options is only allowed with stream true", param="stream_options")
    max_tokens = DEFAULT_MAX_TOKENS if request.max_tokens is None else request.max_tokens
    if not 0 <= max_tokens <= limits.max_tokens:
        raise ApiError(f"max_tokens {max_tokens} is not accepted: expected 0 to {limits.max_tokens}",
                       param="max_tokens")
    given = lambda value, default: default if value is None else value  # noqa: E731
    options = dict(max_new_tokens=max_tokens, temperature=given(request.temperature, defaults.temperature),
                   top_k=given(request.top_k, defaults.top_k), top_p=given(request.top_p, defaults.top_p),
                   repetition_penalty=given(request.repetition_penalty, defaults.repetition_penalty),
                   num_samples=n, seed=request.seed, stop=_stop_of(request, limits))
    check_sampling(_fail, **options)
    prompt = _prompt_of(request)
    prompt_tokens, notes = _prompt_tokens(prompt, tokenizer, limits.max_prompt_tokens or context_length)
    return Completion(prompt, prompt_tokens, SamplingOptions(**options), bool(request.stream),
                      bool(request.stream_options and request.stream_options.include_usage), notes)


def longer_than_tokens_read(text: str, tokenizer, most: int) -> Optional[int]:
    """The most characters one token reads (`Tokenizer.max_token_chars`) where `text` has more than
    `most` such tokens can read, so is sure to be more than `most` tokens without encoding it; else
    None (also where the tokenizer has no such bound: encode and count then)."""
    longest = getattr(tokenizer, "max_token_chars", None)
    return longest if longest is not None and len(text) > most * longest else None


def _prompt_tokens(prompt: str, tokenizer, most: int) -> tuple[int, tuple[str, ...]]:
    """The tokens the model reads for `prompt`, refused past `most`, and the warnings for the client
    (characters read as [UNK]). A prompt of more characters than `most` tokens can read
    (`Tokenizer.max_token_chars`) is refused before it is encoded: encoding megabytes of text takes
    seconds, for a refusal all the same."""
    from tinyattn.data.tokenizer import unknown_characters_note

    if longest := longer_than_tokens_read(prompt, tokenizer, most):
        raise ApiError(f"the prompt is {len(prompt)} characters, more than {most} tokens can read (each at "
                       f"most {longest} characters); this server takes at most {most} tokens",
                       param="prompt", code="context_length_exceeded")
    ids = tokenizer.encode(prompt) if prompt else []
    if prompt and not ids:  # all of it normalised away (a WordPiece tokenizer's " ")
        raise ApiError(f"the prompt {prompt!r} encodes to no tokens: give text the model can read",
                       param="prompt")
    # An empty prompt: one start token; another gets an imported folder's bos where its tokenizer adds it.
    prompt_tokens = len(tokenizer.text_start + ids) if prompt else 1
    if prompt_tokens > most:
        raise ApiError(f"the prompt is {prompt_tokens} tokens; this server takes at most {most}",
                       param="prompt", code="context_length_exceeded")
    note = unknown_characters_note(tokenizer, prompt, ids) if ids else None
    return prompt_tokens, (f"prompt: {note}",) if note else ()
