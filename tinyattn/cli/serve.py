"""`tinyattn serve`: a checkpoint behind an OpenAI-compatible endpoint, with a playground page at `/`.

Parses the arguments, checks the `serve` extra, binds the socket (a port in use is one line),
loads the checkpoint and runs `tinyattn.serve.app` under uvicorn until Ctrl-C. stderr: one
line naming the model and the address, then one `warning: ...` line per warning, uvicorn's
warnings and errors.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional

from tinyattn.cli import run_command, warnings_as_lines
from tinyattn.cli.options import add_checkpoint, add_device, add_inference_dtype, add_out_dir, command_parser

DESCRIPTION = """\
Serve a checkpoint over HTTP: GET /v1/models, POST /v1/completions (OpenAI's completions API,
streamed as server-sent events with "stream": true), GET /health, and a playground page at /
(prompt, sampling controls, streamed text; a click on a generated token opens the attention
explorer at the prediction that produced it). Any OpenAI client works:
  OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused").completions.create(model=..., prompt=...)

Binds 127.0.0.1 unless --host says otherwise; there is no authentication. One thread runs the
model: concurrent requests take turns token by token (up to --max-active at once, the rest wait
in order). Sampling options a request leaves out default to the checkpoint's saved `sample`
config, max_tokens to 16 (OpenAI's default).
"""

EPILOG = """\
examples:
  tinyattn serve --checkpoint checkpoints/shakespeare_char
  tinyattn serve --checkpoint checkpoints/shakespeare_char --port 8080 --max-tokens 2048
  curl -s localhost:8000/v1/completions -H 'Content-Type: application/json' \\
       -d '{"model": "shakespeare_char", "prompt": "ROMEO:", "max_tokens": 50, "seed": 1}'
"""


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("serve", DESCRIPTION, EPILOG,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    add_checkpoint(parser, where="--out-dir")
    add_out_dir(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this "
                                                            "machine only; 0.0.0.0: every interface)")
    parser.add_argument("--port", type=int, default=8000,
                        help="port to listen on (default: 8000; 0: any free one)")
    parser.add_argument("--model-name", metavar="NAME", help="the model's id in the API (default: the run "
                                                              "folder's name)")
    parser.add_argument("--max-tokens", type=int, default=1024, metavar="N",
                        help="the most new tokens one choice may ask for (default: 1024)")
    parser.add_argument("--max-n", type=int, default=8, metavar="N",
                        help="the most choices per request (default: 8)")
    parser.add_argument("--max-active", type=int, default=4, metavar="N",
                        help="requests decoding at once, taking turns (default: 4); the rest wait in order")
    add_device(parser)
    add_inference_dtype(parser)
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    return run_command(lambda: run(args))


def run(args: argparse.Namespace) -> int:
    from tinyattn.errors import ConfigError
    from tinyattn.serve.server import listening_socket, require_serve_extra

    require_serve_extra()  # before any work: a missing extra is one line
    for name in ("max_tokens", "max_n", "max_active"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} {getattr(args, name)}: expected a positive number")
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port {args.port}: expected 0 to 65535")
    if args.model_name is not None and not args.model_name.strip():  # else served as the run's, unsaid
        raise ConfigError(f"--model-name {args.model_name!r}: expected a name for the API's model id "
                          "(default: the run folder's name)")
    sock = listening_socket(args.host, args.port)
    try:
        return _serve(args, sock)
    finally:
        sock.close()


def _serve(args: argparse.Namespace, sock) -> int:
    from tinyattn.checkpoint import require_causal
    from tinyattn.errors import parameter_count_text
    from tinyattn.generate.decoder import prepare_for_generation
    from tinyattn.hf.folder import load_any_model
    from tinyattn.serve.app import create_app
    from tinyattn.serve.schemas import Limits
    from tinyattn.serve.server import serve_forever
    from tinyattn.system.device import select_device

    device = select_device(args.device)
    loaded = load_any_model(args.checkpoint, device, args.out_dir)
    require_causal(loaded, "tinyattn serve")
    # The model as `tinyattn generate` runs it (same dtype, same packed weights), so a completion's
    # text is the command's for the same options and seed.
    prepared = prepare_for_generation(loaded.model, args.dtype, device)  # in place: loaded.model
    limits = Limits(max_tokens=args.max_tokens, max_n=args.max_n, max_active=args.max_active)
    app = create_app(loaded, limits=limits, model_id=args.model_name)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    weights, size = prepared.describe(device), parameter_count_text(loaded.model.num_parameters())
    print(f"{loaded.label}: serving {app.state.served.model_id!r}, "
          f"{size} parameters, {weights}, at http://{shown}:{port} "
          "(playground: /, API: /v1; Ctrl-C stops)", file=sys.stderr, flush=True)
    if host not in ("127.0.0.1", "::1", "localhost"):
        print(f"warning: listening on {host}: anyone who can reach this machine can use the model "
              "(there is no authentication)", file=sys.stderr, flush=True)
    with warnings_as_lines():  # e.g. fp16 copies dropped after an overflow: one line, as generate prints it
        serve_forever(app, sock)
    print("stopped", file=sys.stderr)
    return 0
