"""Python commands started as forks of a Python that has already imported torch.

A test that runs `python scripts/train.py ...` spends most of its time importing torch and
torch._dynamo (which torch.optim imports at its first use; docs/BENCHMARKS.md "Start-up" has the
figures). `Popen` and `run` take subprocess's arguments for a command `[sys.executable, SCRIPT |
-m MODULE | -c CODE, *args]` and start it as a fork of a server process (one per test process) that
imported those modules once, then nothing else. The child has its own pid, standard streams, working
directory, environment, session, signals and exit status, and runs the command as `python` would:
`sys.argv`, `sys.path[0]`, `__main__`, exit codes (an uncaught Ctrl-C ends it by SIGINT), `atexit`,
standard streams made afresh for the new descriptors, and fresh random seeds.

A real subprocess is started instead where a fork could differ: another interpreter or a shell, a
preexec_fn, user or group changes, pass_fds, a working directory that is not a folder, a relative
PYTHONPATH entry, or an environment whose variables read while torch imports (OMP_*, MKL_*, ATEN_*,
TORCH*, PYTORCH*, DNNL_*, ONEDNN_*, CUDA*, LD_*, PYTHON*) differ from the server's. What a fork still
does not give: its own string-hash seed, the finalization of objects alive at exit (a file never
closed is not flushed; the command's atexit handlers and non-daemon threads do run, the preloaded
modules' weakref finalizers do not), tracebacks without the server's frames, and a process age that
counts the interpreter's and torch's start-up. So tests of whether a fresh interpreter imports one of
the preloaded modules, of its shutdown (a standard stream that fails at exit), or of wall time from
the process's start use `subprocess` itself; a test that a command does not import a module the
server never loaded (tinyattn's periphery, matplotlib, datasets) may fork: the import shows in both.
"""

import inspect
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading

PRELOADED = ("torch", "torch._dynamo")
_EXECUTE_CHILD_PARAMETERS = list(inspect.signature(subprocess.Popen._execute_child).parameters)[1:]
READ_AT_IMPORT = ("OMP_", "MKL_", "KMP_", "GOMP_", "ATEN_", "TORCH", "PYTORCH", "DNNL_", "ONEDNN_", "CUDA",
                  "LD_", "PYTHON")
# Matched by READ_AT_IMPORT, but read only when asked (torch.distributed.is_torchelastic_launched, the
# ranks' init_distributed): start_ranks gives it as torchrun does
READ_LATER = ("TORCHELASTIC_RUN_ID",)


class Popen(subprocess.Popen):
    """subprocess.Popen for `[sys.executable, ...]`, started as a fork of the warm server where it can be.

    ignored_signals: signals the command starts with ignored (as `nohup` leaves SIGHUP), in place of
    a preexec_fn that a fork cannot run."""

    _status_fd = None  # the pipe the child's exit status arrives on; None for a real subprocess

    def __init__(self, args, *, ignored_signals=(), **kwargs):
        self._ignored_signals = tuple(int(s) for s in ignored_signals)
        if self._ignored_signals and kwargs.get("preexec_fn"):
            raise ValueError("give ignored_signals or preexec_fn, not both")
        super().__init__(args, **kwargs)

    @property
    def forked(self) -> bool:
        return self._status_fd is not None

    def _execute_child(self, *arguments):
        given = dict(zip(_EXECUTE_CHILD_PARAMETERS, arguments))
        env = os.environ if given["env"] is None else given["env"]
        given["env"] = {os.fsdecode(k): os.fsdecode(v) for k, v in env.items()}
        if not self._forks(given):
            if self._ignored_signals:
                given["preexec_fn"] = _ignoring(self._ignored_signals)
            super()._execute_child(*given.values())

    def _forks(self, given) -> bool:
        """Starts the command as a fork of the server; False where it cannot (nothing is started then)."""
        server = _server_for(list(given["args"]), given)
        cwd = os.fsdecode(given["cwd"] if given["cwd"] is not None else os.getcwd())
        if server is None or not os.path.isdir(cwd):  # subprocess raises FileNotFoundError for a bad cwd
            return False
        request = {"argv": [os.fsdecode(a) for a in given["args"][1:]], "env": given["env"],
                   "cwd": os.path.abspath(cwd), "new_session": bool(given["start_new_session"]),
                   "ignored_signals": self._ignored_signals}
        standard = [given[name] if given[name] != -1 else fd
                    for fd, name in enumerate(("p2cread", "c2pwrite", "errwrite"))]
        status_read, status_write = os.pipe()
        try:
            server.start(request, [*standard, status_write])
        except OSError:
            pass
        finally:
            os.close(status_write)
        pid = _read_exactly(status_read, 8)
        if not pid:  # the server has gone before it forked: a real subprocess runs the command
            os.close(status_read)
            return False
        self._status_fd = status_read
        self.pid = struct.unpack("q", pid)[0]
        self._child_created = True
        self._close_pipe_fds(*(given[name] for name in ("p2cread", "p2cwrite", "c2pread", "c2pwrite",
                                                        "errread", "errwrite")))
        return True

    def _try_wait(self, wait_flags):
        if not self.forked:
            return super()._try_wait(wait_flags)
        if wait_flags & os.WNOHANG and not select.select([self._status_fd], [], [], 0)[0]:
            return 0, 0
        data = _read_exactly(self._status_fd, 8)
        os.close(self._status_fd)
        self._status_fd = -1  # still forked, but read
        return self.pid, struct.unpack("q", data)[0] if data else 255 << 8

    def _internal_poll(self, _deadstate=None, **kwargs):
        if not self.forked:
            return super()._internal_poll(_deadstate, **kwargs)
        if self.returncode is None and self._waitpid_lock.acquire(False):
            try:
                if self.returncode is None and self._status_fd >= 0:
                    pid, status = self._try_wait(os.WNOHANG)
                    if pid == self.pid:
                        self._handle_exitstatus(status)
            finally:
                self._waitpid_lock.release()
        return self.returncode


def run(args, *, input=None, capture_output=False, timeout=None, check=False, **kwargs):
    """subprocess.run through `Popen` above."""
    if capture_output:
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    if input is not None:
        kwargs["stdin"] = subprocess.PIPE
    with Popen(args, **kwargs) as process:
        try:
            stdout, stderr = process.communicate(input, timeout=timeout)
        except BaseException:
            process.kill()
            process.wait()
            raise
    done = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    if check:
        done.check_returncode()
    return done


def _ignoring(signals):
    def ignore():
        for number in signals:
            signal.signal(number, signal.SIG_IGN)
    return ignore


def _read_exactly(fd: int, size: int) -> bytes:
    data = b""
    while len(data) < size:
        part = os.read(fd, size - len(data))
        if not part:
            return b""
        data += part
    return data


# ----------------------------------------------------------------------------- the server


class _Server:
    """The warm Python: a child of this process that imported PRELOADED and forks on request."""

    def __init__(self):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.env = dict(os.environ)
        self.process = subprocess.Popen(
            [sys.executable, "-c", _SERVER, str(theirs.fileno()), ",".join(PRELOADED)],
            pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            env=self.env)
        theirs.close()
        self.socket = ours
        self.lock = threading.Lock()
        self.set_by_imports = None  # what importing PRELOADED put in os.environ, once they are done

    def serves(self, env) -> bool:
        """Whether a fork sees the environment `env` as a fresh Python would: the same variables that
        torch reads at import, save those the imports set themselves (torch._dynamo sets
        TORCHINDUCTOR_CACHE_DIR in every process that imports it, this test process included)."""
        with self.lock:
            if self.set_by_imports is None:
                self.set_by_imports = json.loads(self.socket.recv(1 << 20) or "{}")

        def read_at_import(variables):
            return {k: v for k, v in variables.items() if k.startswith(READ_AT_IMPORT) and k not in READ_LATER
                    and not (k not in self.env and self.set_by_imports.get(k) == v)}
        relative = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and not os.path.isabs(p)]
        return (read_at_import(env) == read_at_import(self.env) and not relative
                and self.process.poll() is None)

    def start(self, request, fds):
        with self.lock:
            socket.send_fds(self.socket, [json.dumps(request).encode()], fds)

    def close(self):
        self.socket.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()


_servers = {}


def _server_for(args, given):
    """The server to fork `args` from, or None where a real subprocess must run it."""
    if given["executable"] is not None or given["shell"] or given["preexec_fn"] is not None \
            or given["pass_fds"] or given["umask"] != -1 or given["process_group"] not in (None, -1) \
            or any(given[name] is not None for name in ("gid", "gids", "uid")):
        return None
    if len(args) < 2 or os.fsdecode(args[0]) != sys.executable:
        return None
    option = os.fsdecode(args[1])
    if option.startswith("-") and option not in ("-c", "-m") or option in ("-c", "-m") and len(args) < 3:
        return None
    if os.getpid() not in _servers:  # a fork of a test process starts its own
        import atexit

        _servers[os.getpid()] = server = _Server()
        atexit.register(server.close)
    server = _servers[os.getpid()]
    return server if server.serves(given["env"]) else None


# The server's program. It is as single-threaded as torch leaves it, forks nothing until asked,
# and for each request forks a watcher, which forks the command and sends its pid and then its
# wait status on the status pipe. The watcher ignores the signals a test sends to the command's
# process group; the server reaps watchers as they end.
_SERVER = r'''
import importlib, io, json, os, runpy, signal, socket, struct, sys, traceback, types

sock = socket.socket(fileno=int(sys.argv[1]))
started_with = dict(os.environ)
for name in filter(None, sys.argv[2].split(",")):
    importlib.import_module(name)
set_by_imports = {k: v for k, v in os.environ.items() if k not in started_with}
# The finalizers those imports registered (torch.library's, one per operator library, which undo its
# registrations) ran at every fork's exit, most of the time a short command took, and to no effect
# a process about to end could show: neither the forks nor the server run them at exit.
import weakref
for finalizer in list(weakref.finalize._registry):
    finalizer.atexit = False
sock.sendall(json.dumps(set_by_imports).encode())
STOPS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT}


def standard_streams(env):
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    streams = []
    for fd, old in enumerate((sys.__stdin__, sys.__stdout__, sys.__stderr__)):
        writes = fd > 0
        buffering = 0 if unbuffered and writes else -1
        buffer = open(fd, "wb" if writes else "rb", buffering=buffering, closefd=False)
        streams.append(io.TextIOWrapper(
            buffer, old.encoding, old.errors, newline="\n", write_through=unbuffered and writes,
            line_buffering=not unbuffered and (fd == 2 or fd == 1 and os.isatty(1))))
    sys.stdin, sys.stdout, sys.stderr = sys.__stdin__, sys.__stdout__, sys.__stderr__ = streams


def run_as_python(argv):
    if argv[0] == "-c":
        sys.argv, sys.path[0] = ["-c", *argv[2:]], ""
        main = types.ModuleType("__main__")
        sys.modules["__main__"] = main
        exec(compile(argv[1], "<string>", "exec"), main.__dict__)
    elif argv[0] == "-m":
        sys.argv, sys.path[0] = [argv[1], *argv[2:]], os.getcwd()
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        if not os.path.exists(argv[0]):
            print(f"{sys.executable}: can't open file {os.path.abspath(argv[0])!r}: [Errno 2] No such file "
                  "or directory", file=sys.stderr)
            raise SystemExit(2)
        sys.argv, sys.path[0] = list(argv), os.path.dirname(os.path.realpath(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")


def as_a_fresh_process():
    """What a fresh Python draws or looks up at start: `random`, numpy's and torch's seeds (forks
    share the server's), the temporary folder (the command's TMPDIR)."""
    import random, tempfile
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    if "torch" in sys.modules:
        sys.modules["torch"].seed()
    tempfile.tempdir = None


def exit_code(code):
    if code is None or isinstance(code, int):
        return code or 0
    print(code, file=sys.stderr)
    return 1


def command(request, fds):
    """The command's process: signals as a fresh Python has them, then unblocked (one sent since the
    fork is delivered now, to the command's own handling)."""
    if request["new_session"]:
        os.setsid()
    for number in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(number, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for number in request["ignored_signals"]:
        signal.signal(number, signal.SIG_IGN)
    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)
    for fd in set(fds) - {0, 1, 2}:
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update({**set_by_imports, **request["env"]})
    standard_streams(request["env"])
    as_a_fresh_process()
    code, interrupted = 0, False
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)
        run_as_python(request["argv"])
    except SystemExit as exit:
        code = exit_code(exit.code)
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        code, interrupted = 1, True
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    import atexit, threading
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            code = 120
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def watch(request, fds):
    """Forks the command with the stop signals blocked (a test may signal it as soon as it has the
    pid), sends its pid and then its wait status, and ignores those signals itself."""
    for number in STOPS:
        signal.signal(number, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
    pid = os.fork()
    if pid == 0:
        command(request, fds)
    os.write(fds[3], struct.pack("q", pid))
    for fd in fds[:3]:
        os.close(fd)
    _, status = os.waitpid(pid, 0)
    os.write(fds[3], struct.pack("q", status))
    os._exit(0)


while True:
    try:
        message, fds, _, _ = socket.recv_fds(sock, 1 << 20, 4)
    except OSError:
        break
    if not message:
        break
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                break
        except ChildProcessError:
            break
    sys.stdout.flush()
    sys.stderr.flush()
    if os.fork() == 0:
        sock.close()
        watch(json.loads(message), fds)
    for fd in fds:
        os.close(fd)
'''
