"""The routes of `tinyattn serve` (FastAPI): OpenAI's completions API, a health route, the playground.

- `GET /v1/models`, `GET /v1/models/{id}`: the one model served (its run folder's name).
- `POST /v1/completions`: OpenAI's fields (`schemas.CompletionRequest`); with `"stream": true`
  the text comes as server-sent events in OpenAI's chunk format, ending with `data: [DONE]`.
  Every completion is `tinyattn.generate.text.stream_samples` with the request's options, so
  choice i equals `generate()` with seed `seed + i` (wrapping past 2**63 - 1 to 0; exactly in
  fp32; with n > 1 in bf16 or with fp16 row copies, the choices' batch rounds differently from
  one sequence). Finish reasons: "stop" (a stop string or
  the end-of-text token) and "length". `usage.completion_tokens` counts the tokens sampled for
  the choices, each up to and including the one that ended it (the end-of-text token, the one
  completing a stop string; `SamplePiece.tokens`), not the returned text re-encoded.
- `GET /health`: {"status": "ok"} with the worker's load (requests decoding, waiting, done);
  a 503 if the model thread has stopped.
- `GET /`: the playground page; `POST /explorer` returns the explorer page
  (`tinyattn.analysis.explorer`) of a text, at the prediction that produced the token holding
  a given character: what the playground shows when a generated token is clicked. A text
  generated from an empty prompt (`"empty_prompt": true`) is read after the start token
  generation began from, which predicted its first token. A text longer than the explorer takes
  (`Limits.max_explore_tokens`) is read as its last tokens up to the clicked one, said on the page.

Every GET route answers HEAD too (its headers, no body). Mistakes in a request are 400s with
OpenAI's error body (`schemas.ApiError`), unknown routes 404s (a served route with a
trailing slash too: never a redirect), and anything unexpected a 500 with the same body: the server
stays up. Model calls run on one thread (`worker.ModelWorker`); a client that goes away mid-stream
cancels its job. A request's text is encoded in the thread pool, never on the event loop, which every
client shares.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib import resources
from typing import AsyncIterator, Optional, Sequence

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from tinyattn.config import SampleConfig
from tinyattn.errors import counted
from tinyattn.serve.schemas import (
    ApiError,
    Completion,
    CompletionRequest,
    ExploreRequest,
    Limits,
    check_completion,
    longer_than_tokens_read,
    parse,
)
from tinyattn.serve.worker import Job, ModelWorker, one_call

FINISH_REASONS = {"stop": "stop", "eot": "stop", "length": "length"}  # tinyattn's -> OpenAI's
RE_ENCODED = 4  # tokens a generated token's text may encode into again (`_explorer_text_ids`)
EVENT_STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}  # no proxy holds chunks back
ROUTES_SERVED = "GET /v1/models, POST /v1/completions, GET /health and GET / (the playground)"
DISCONNECT_POLL_S = 0.25  # how often a non-streamed request checks that its client is still there


@dataclass
class Served:
    """What the routes share: the model, its name, the limits and the worker thread."""

    model: object
    tokenizer: object
    sample: object  # the checkpoint's SampleConfig: defaults for options a request leaves out
    model_id: str
    limits: Limits
    worker: ModelWorker
    created: int


def create_app(loaded, *, limits: Limits = Limits(), model_id: Optional[str] = None) -> FastAPI:
    """The app serving `loaded` (a `tinyattn.checkpoint.LoadedModel`); its worker runs while it is served."""
    model_id = model_id or loaded.name  # the run folder's or Hugging Face folder's name
    worker = ModelWorker(max_active=limits.max_active, max_waiting=limits.max_waiting,
                         warm_up=lambda: _warm_up(loaded.model, loaded.tokenizer))
    served = Served(loaded.model, loaded.tokenizer, loaded.config.sample, model_id, limits, worker,
                    int(time.time()))

    @asynccontextmanager
    async def lifespan(app):
        served.worker.start()
        yield
        served.worker.stop()

    # No redirect_slashes: Starlette answers POST /v1/completions/ with an empty 307 to an address made
    # from the Host header (http:// behind a TLS proxy), which curl does not follow; a 404 names the routes.
    app = FastAPI(title="tinyattn serve", lifespan=lifespan, docs_url=None, redoc_url=None,
                  redirect_slashes=False)
    app.state.served = served
    _add_error_handlers(app)
    _add_routes(app, served)
    return app


def _error_response(error: ApiError, headers: Optional[dict] = None) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request, error: ApiError):
        return _error_response(error)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, error: StarletteHTTPException):
        kind = {404: "not_found", 405: "method_not_allowed"}.get(error.status_code)
        message = f"{request.method} {request.url.path}: {error.detail}"
        if error.status_code == 404:  # what to send instead (a client's first call is often chat)
            message += f"; this server answers {ROUTES_SERVED}"
        # Starlette's own headers go along: a 405's Allow, which HTTP requires, names the methods taken.
        return _error_response(ApiError(message, status=error.status_code, code=kind), error.headers)

    @app.exception_handler(Exception)
    async def server_error(request, error: Exception):
        return _error_response(ApiError(f"the server failed on this request: {type(error).__name__}",
                                        status=500, type="server_error"))


def _get(app: FastAPI, path: str, **kwargs):
    """A GET route that answers HEAD too, as HTTP requires (FastAPI's `app.get` takes GET only: a
    monitor's HEAD /health read 405); uvicorn sends a HEAD's headers without the body. The route that
    answers is left out of /openapi.json, which a GET-only twin lists: one route of two methods gives
    both the same operationId there (an invalid document; FastAPI warns in the server's log)."""
    def register(endpoint):
        app.add_api_route(path, endpoint, methods=["GET", "HEAD"], include_in_schema=False, **kwargs)
        app.add_api_route(path, endpoint, methods=["GET"], **kwargs)  # never reached: the one above answers
        return endpoint
    return register


def _add_routes(app: FastAPI, served: Served) -> None:
    def model_card() -> dict:
        return {"id": served.model_id, "object": "model", "created": served.created, "owned_by": "tinyattn",
                "context_length": served.model.config.context_length}

    @_get(app, "/health")
    async def health():
        if not served.worker.alive:  # nothing can be generated: say so, with a status monitors read
            return JSONResponse({"status": "the model thread has stopped", "model": served.model_id},
                                status_code=503)
        return {"status": "ok", "model": served.model_id, **served.worker.load}

    @_get(app, "/v1/models")
    async def models():
        return {"object": "list", "data": [model_card()]}

    @_get(app, "/v1/models/{model_id:path}")
    async def model(model_id: str):
        _check_model(served, model_id)
        return model_card()

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = parse(CompletionRequest, await _read_body(request, served.limits.max_body_bytes))
        _check_model(served, body.model)
        # Off the event loop: encoding a long prompt takes a while, and every other client waits on the loop.
        completion = await run_in_threadpool(check_completion, body, limits=served.limits,
                                             defaults=served.sample, tokenizer=served.tokenizer,
                                             context_length=served.model.config.context_length)
        created = int(time.time())  # one timestamp for the whole completion: every chunk of a stream has it
        job = Job(_samples(served, completion), asyncio.get_running_loop(), "a completion")
        served.worker.submit(job)
        if completion.stream:
            return StreamingResponse(_events(served, completion, job, created),
                                     media_type="text/event-stream", headers=EVENT_STREAM_HEADERS)
        return await _whole(served, completion, job, request, created)

    @app.post("/explorer", response_class=HTMLResponse)
    async def explorer(request: Request):
        body = parse(ExploreRequest, await _read_body(request, served.limits.max_body_bytes))
        ids, query, note = await run_in_threadpool(_explorer_query, served, body)  # encodes: off the loop
        job = served.worker.submit(Job(one_call(lambda: _explorer_page(served, ids, query, note)),
                                       asyncio.get_running_loop(), "an explorer page"))
        async for page in job.items():
            return HTMLResponse(page)
        raise _stopped("this explorer page")  # cancelled before its turn: the server is stopping

    @_get(app, "/", response_class=HTMLResponse)
    async def playground():
        return HTMLResponse(playground_html(served.model_id, served.sample, served.limits.max_tokens))


async def _read_body(request: Request, most: int) -> bytes:
    """The request's body, refused with a 413 past `most` bytes: by its Content-Length before any of it
    is read, else (chunks) as soon as it has more. Read whole, a body of gigabytes was held in memory
    three times over (the bytes, then the parsed text) before the prompt's length refused it."""
    def too_large(size: str) -> ApiError:
        return ApiError(f"the request body is {size} bytes; this server takes at most {most:,} "
                        f"({most / 2**20:g} MiB)", status=413, code="request_too_large")

    announced = request.headers.get("content-length", "")
    if announced.isdigit() and int(announced) > most:
        raise too_large(f"{int(announced):,}")
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > most:
                raise too_large(f"more than {most:,}")
    except ClientDisconnect:  # an answer no one reads; unhandled, a traceback in the server's log
        raise ApiError("the client closed the connection before its request body was read whole") from None
    return bytes(body)


def _check_model(served: Served, name: str) -> None:
    if name != served.model_id:
        raise ApiError(f"model {name!r} is not served here; this server serves {served.model_id!r}",
                       status=404, param="model", code="model_not_found")


# ----------------------------------------------------------------------------- completions


def _samples(served: Served, completion: Completion):
    """The completion's turns (run on the model thread). KV caches that cannot fit in the memory
    free when its decoding starts: with n > 1 the client can ask for fewer (a 400 naming n); one
    sequence that cannot fit is the server's shortage, for now (a 503). The caches hold the positions
    the prompt and max_tokens reach (`cache_positions`): both answers say a smaller one needs less."""
    from tinyattn.generate.text import stream_samples
    from tinyattn.model.memory import KVCachesTooLarge

    try:
        yield from stream_samples(served.model, served.tokenizer, completion.prompt, completion.options)
    except KVCachesTooLarge as e:
        n = completion.options.num_samples
        if n > 1:
            raise ApiError(f"{e.shortage}; ask for a smaller n than {n}, a smaller max_tokens or a shorter "
                           "prompt", param="n") from None
        raise ApiError(f"{e.shortage}: the server cannot decode this request now (its memory, or the "
                       "requests it is decoding); a smaller max_tokens or a shorter prompt needs less",
                       status=503, type="server_error") from None


def _warm_up(model, tokenizer) -> None:
    """Two sampled tokens on the model thread: a thread's first model calls are much slower than
    the rest (thread pools, kernels chosen), and the first client should not wait for that."""
    from tinyattn.generate.sampling import SamplingOptions
    from tinyattn.generate.text import stream_samples

    options = SamplingOptions(max_new_tokens=2, temperature=1.0, top_p=0.9, seed=0)
    for _ in stream_samples(model, tokenizer, "", options):
        pass


def _completion_id() -> str:
    return f"cmpl-{uuid.uuid4().hex[:24]}"


def _usage(completion: Completion, generated: list[int]) -> dict:
    """OpenAI's usage: the prompt's tokens, and the tokens generated for the choices (each up to and
    including the one that ended it: at most max_tokens each)."""
    total = sum(generated)
    return {"prompt_tokens": completion.prompt_tokens, "completion_tokens": total,
            "total_tokens": completion.prompt_tokens + total}


def _body(served: Served, completion_id: str, created: int, choices: list[dict],
          usage: Optional[dict], *, warnings: Sequence[str] = ()) -> dict:
    """OpenAI's completion object; every chunk of one stream carries the same id and `created` (the
    time the request was taken, in whole seconds), as OpenAI's do. `warnings` (how the prompt was
    read: characters read as [UNK]), tinyattn's addition, is there only when there are some."""
    body = {"id": completion_id, "object": "text_completion", "created": created,
            "model": served.model_id, "choices": choices, "usage": usage}
    return {**body, "warnings": list(warnings)} if warnings else body


def _choice(index: int, text: str, finish_reason: Optional[str]) -> dict:
    return {"index": index, "text": text, "logprobs": None,
            "finish_reason": None if finish_reason is None else FINISH_REASONS[finish_reason]}


async def _cancel_when_gone(job: Job, request: Request) -> None:
    """Cancel `job` if its client goes away (a non-streamed request has no send to fail on)."""
    while not await request.is_disconnected():
        await asyncio.sleep(DISCONNECT_POLL_S)
    job.cancel()


async def _whole(served: Served, completion: Completion, job: Job, request: Request,
                 created: int) -> JSONResponse:
    n = completion.options.num_samples
    texts, finished, generated = [""] * n, [None] * n, [0] * n
    watcher = asyncio.create_task(_cancel_when_gone(job, request))
    try:
        async for piece in job.items():
            texts[piece.sample] += piece.text
            finished[piece.sample] = piece.finish_reason or finished[piece.sample]
            generated[piece.sample] += piece.tokens
    finally:
        watcher.cancel()
        job.cancel()  # a no-op when it has ended; stops it when this handler is cancelled
    if any(reason is None for reason in finished):  # cancelled: the server is stopping (Ctrl-C)
        raise _stopped("this completion")
    choices = [_choice(i, texts[i], finished[i]) for i in range(n)]
    body = _body(served, _completion_id(), created, choices, _usage(completion, generated),
                 warnings=completion.warnings)
    return JSONResponse(body)


def _stopped(what: str) -> ApiError:
    """A request the server's shutdown cancelled: a 503, not a 200 with part of the answer."""
    return ApiError(f"the server is shutting down: {what} was stopped before it ended; send it again to "
                    "a running server", status=503, type="server_error", code="server_shutting_down")


def _event(value: dict) -> str:
    return f"data: {json.dumps(value, ensure_ascii=False)}\n\n"


async def _events(served: Served, completion: Completion, job: Job, created: int) -> AsyncIterator[str]:
    """Server-sent events: one chunk per piece, the usage chunk if asked for, then [DONE]. A stream
    the server's shutdown cuts short (a choice without its finish reason) ends in the error event a
    whole completion's 503 would carry instead of the usage chunk: not a finished answer, and no count
    of a part (a choice's tokens are counted on its last piece).

    When the client goes away, sending the next chunk fails and Starlette closes this
    generator: its `finally` cancels the job, which the worker then closes before its next turn.
    """
    completion_id = _completion_id()
    n = completion.options.num_samples
    finished, generated = [None] * n, [0] * n
    warnings = completion.warnings  # on the first chunk only
    try:
        async for piece in job.items():
            finished[piece.sample] = piece.finish_reason or finished[piece.sample]
            generated[piece.sample] += piece.tokens
            choice = _choice(piece.sample, piece.text, piece.finish_reason)
            yield _event(_body(served, completion_id, created, [choice], None, warnings=warnings))
            warnings = ()
        if any(reason is None for reason in finished):  # cancelled: the server is stopping (Ctrl-C)
            raise _stopped("this completion")
        if completion.include_usage:
            yield _event(_body(served, completion_id, created, [], _usage(completion, generated)))
    except ApiError as error:  # the worker failed mid-stream: the headers are gone, so say it in the stream
        yield _event(error.body())
    finally:
        job.cancel()
    yield "data: [DONE]\n\n"


# ----------------------------------------------------------------------------- the explorer and the page


def _explorer_text_ids(served: Served, text: str) -> list[int]:
    """The text's tokens, refused past what a completion here can make: a prompt of at most the
    prompt limit, then at most max_tokens, each of whose texts encodes again into at most
    RE_ENCODED tokens (a token ending inside a UTF-8 character decodes to U+FFFD, three bytes that a
    byte-level BPE may read as three tokens). Finding the clicked token decodes the text once per
    token, work that grows as the square of its length, and no client should buy minutes of it. A
    text of more characters than that many tokens can read is refused before it is encoded."""
    limits = served.limits
    prompt_most = limits.max_prompt_tokens or served.model.config.context_length
    completion = prompt_most + limits.max_tokens
    most = completion * RE_ENCODED
    longest = longer_than_tokens_read(text, served.tokenizer, most)
    ids = None if longest else served.tokenizer.encode(text)
    if ids is None or len(ids) > most:
        size = (f"{len(ids)} tokens" if ids is not None
                else f"{len(text)} characters, more than {most} tokens can read (each at most {longest})")
        raise ApiError(f"text: {size}; the explorer takes the text of a completion here: a prompt of at most "
                       f"{prompt_most} tokens, then at most {limits.max_tokens}, which encode again into at "
                       f"most {most}", param="text")
    return ids


def _explorer_query(served: Served, body: ExploreRequest) -> tuple[list[int], int, str]:
    """The text's token ids, the query (the prediction that produced the token holding `offset`) and
    a note, "" unless the text was cut. Read as generation read it: after the start token it began
    from where the prompt was empty (`empty_prompt`: what predicted the first token), else after an
    imported folder's bos where its tokenizer puts it first. A text longer than the explorer takes
    (`max_explore_tokens`) is cut to its last tokens up to and including the clicked one."""
    from tinyattn.analysis.attention_maps import token_spans
    from tinyattn.generate.text import encode_prompt

    if body.empty_prompt:
        start = encode_prompt(served.tokenizer, "", served.model.config.context_length)
    else:
        start = served.tokenizer.text_start
    text_ids = _explorer_text_ids(served, body.text)
    ids = start + text_ids
    most = served.limits.max_explore_tokens
    if len(ids) < 2:
        raise ApiError(f"text: {counted(len(ids), 'token')}; the explorer takes at least 2", param="text")
    text, spans = token_spans(served.tokenizer, text_ids)  # offsets are the text's, without the start
    if not 0 <= body.offset < len(text):
        raise ApiError(f"offset {body.offset} is not accepted: expected 0 to {len(text) - 1}, a character of "
                       "the text", param="offset")
    position = len(start) + next(t for t, (_, end) in enumerate(spans) if end > body.offset)
    if position == 0:  # no start token before the text: no prediction produced its first token
        raise ApiError(f"offset {body.offset} is not accepted: it is in the text's first token, which no "
                       "prediction produced (nothing comes before it); expected a character of a later "
                       'token, or "empty_prompt": true for a text generated from an empty prompt',
                       param="offset")
    if len(ids) <= most:
        return ids, position - 1, ""
    begin = max(position + 1 - most, 0)  # the window ends at the clicked token
    note = (f"the page counts in a window of the text: its token i is the text's token {begin} + i "
            f"(tokens {begin} to {position} of the text's {len(ids)}, the last up to the clicked one; the "
            f"explorer takes at most {most})")
    return ids[begin:position + 1], position - begin - 1, note


def _explorer_page(served: Served, ids: list[int], query: int, note: str = "") -> str:
    """On the worker thread: the explorer page of `ids` (relevance measured here), at `query`; `note`
    (where the text was cut) follows the page's source line."""
    from tinyattn.analysis.ablation import compute_relevance
    from tinyattn.analysis.attention_maps import visible
    from tinyattn.analysis.explorer import explorer_html

    labels = [visible(served.tokenizer.token_text(i)) for i in ids]
    relevance = compute_relevance(served.model, ids, labels)
    return explorer_html(relevance, title=f"{served.model_id}: token {query + 1}",
                         source=f"the prediction at position {query}, which produced token {query + 1}"
                                + (f"; {note}" if note else ""),
                         query=query)


PLAYGROUND_MAX_TOKENS = 200  # the page's max tokens control starts here, within the server's limit
PAGE_FILES = {"PAGE": "playground.html", "STYLE": "playground.css", "SCRIPT": "playground.js"}


def playground_html(model_id: str, sample: Optional[SampleConfig] = None,
                    max_tokens: int = Limits.max_tokens) -> str:
    """The playground: one page, its style and script inline, nothing fetched but this server's routes.
    Its sampling controls start at `sample`'s values (the checkpoint's, which a request that leaves
    them out gets): the page sends every control, so a greedy imported folder stays greedy there.
    Its max tokens starts at PLAYGROUND_MAX_TOKENS or the server's `max_tokens` limit if lower (a
    `--max-tokens` below it refused the page's first request), and goes no higher than that limit."""
    import html

    sample = sample or SampleConfig()
    part = {name: resources.files("tinyattn.serve").joinpath(file).read_text(encoding="utf-8")
            for name, file in PAGE_FILES.items()}
    controls = {"TEMPERATURE": sample.temperature, "TOP_P": sample.top_p, "TOP_K": sample.top_k or 0,
                "MAX_TOKENS": min(PLAYGROUND_MAX_TOKENS, max_tokens), "MOST_TOKENS": max_tokens}
    values = {"STYLE": part["STYLE"], "SCRIPT": part["SCRIPT"], **{k: str(v) for k, v in controls.items()},
              "MODEL": html.escape(model_id, quote=True)}
    page = part["PAGE"]
    for name, value in values.items():  # the model's name goes last: it cannot bring in a placeholder
        page = page.replace(f"%{name}%", value)
    return page
