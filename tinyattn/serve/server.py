"""Running the app: the extra's check, the listening socket, uvicorn in the foreground or in a thread.

The socket is bound here, before uvicorn starts, so a port in use is one line naming it
(and port 0 picks a free port, which `ServerThread.url` then names: the tests and
benchmarks/serve.py start servers that way).
"""

from __future__ import annotations

import socket
import threading
import time
from contextlib import suppress

from tinyattn.errors import TinyattnError
from tinyattn.system.signals import sigterm_interrupts


class ServeUnavailable(TinyattnError):
    """The `serve` extra (FastAPI, uvicorn) is not installed."""


def require_serve_extra() -> None:
    """A one-line ServeUnavailable unless FastAPI and uvicorn can be imported."""
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise ServeUnavailable(f"tinyattn serve needs the serve extra ({e.name} is missing): "
                               "pip install 'tinyattn[serve]'") from None


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port and listening; a TinyattnError naming them if it cannot be."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise TinyattnError(f"cannot listen on {host}:{port}: {e.strerror or e} "
                            "(choose another --port or --host)") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def uvicorn_server(app, sock: socket.socket):
    """A uvicorn server for `app` on `sock`; on Ctrl-C it first cancels the app's generations, so
    open streams end at once (with `data: [DONE]`) instead of holding up the shutdown."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            app.state.served.worker.cancel_all()
            super().handle_exit(sig, frame)
            if self.force_exit:  # a second Ctrl-C: the model thread is not waited for
                app.state.served.worker.hurry()

        async def shutdown(self, sockets=None) -> None:
            # A second Ctrl-C forces the exit, and uvicorn then skips the lifespan's shutdown: the model
            # thread would not stop, and the exit would cancel the waiting lifespan with a traceback.
            await super().shutdown(sockets)
            if self.force_exit:
                await self.lifespan.shutdown()

    host, port = sock.getsockname()[:2]
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                            timeout_graceful_shutdown=5)
    return Server(config)


def serve_forever(app, sock: socket.socket) -> None:
    """uvicorn in the foreground until Ctrl-C or SIGTERM: the normal way to stop, so no error.

    uvicorn shuts down on either, then raises the signal again under the handler it found: SIGTERM's
    is made to interrupt as SIGINT's does (by default SIGTERM would end the process, with status 143).
    """
    with sigterm_interrupts(), suppress(KeyboardInterrupt):  # uvicorn raises it again once shut down
        uvicorn_server(app, sock).run(sockets=[sock])


class ServerThread:
    """The app served by uvicorn in a background thread, on an already bound socket.

    `with ServerThread(app, listening_socket("127.0.0.1", 0)) as server: server.url ...`
    """

    def __init__(self, app, sock: socket.socket):
        self.app, self.sock = app, sock
        host, port = sock.getsockname()[:2]
        self.url = f"http://{host}:{port}"
        self.server = uvicorn_server(app, sock)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)

    def __enter__(self) -> "ServerThread":
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server thread did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()
