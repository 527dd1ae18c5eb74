"""tests/warm_python.py starts a command as a fork of a Python that imported torch: what the command
sees and what the test gets back must be what a fresh `python` gives."""

import os
import signal
import subprocess
import sys

import pytest

from tests import warm_python

PROBE = """import os, signal, sys
print(sys.argv, repr(sys.path[0]), os.getcwd(), os.environ.get("PROBE"), sys.stdout.line_buffering,
      sys.stdin.readline().strip(), signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGHUP),
      __name__)
print("to stderr", file=sys.stderr)
outcome = sys.argv[1]
if outcome == "raises":
    raise ValueError("boom")
if outcome == "ctrl-c":
    raise KeyboardInterrupt
if outcome == "message":
    sys.exit("a message")
sys.exit(int(outcome))
"""


@pytest.mark.parametrize("outcome", ["0", "3", "raises", "ctrl-c", "message"])
def test_a_forked_command_sees_and_returns_what_a_fresh_python_does(tmp_path, outcome):
    def both(module):
        return module.run([sys.executable, "-c", PROBE, outcome], input="a line\n", capture_output=True,
                          text=True, cwd=tmp_path, env={**os.environ, "PROBE": "set"}, timeout=60)

    with warm_python.Popen([sys.executable, "-c", ""]) as process:
        assert process.forked
    forked, fresh = both(warm_python), both(subprocess)
    assert fresh.stdout.startswith(f"['-c', '{outcome}'] '' {tmp_path} set False a line ")
    assert (forked.returncode, forked.stdout) == (fresh.returncode, fresh.stdout)
    assert forked.stderr.splitlines()[0] == "to stderr" and forked.stderr.splitlines()[-1] == \
        fresh.stderr.splitlines()[-1]  # the exception's last line; the frames above it differ
    assert forked.returncode == {"0": 0, "3": 3, "raises": 1, "ctrl-c": -signal.SIGINT, "message": 1}[outcome]


def test_a_script_and_a_module_run_as_python_runs_them(tmp_path):
    script = tmp_path / "folder" / "script.py"
    script.parent.mkdir()
    script.write_text("import sys\nprint(sys.argv[1:], sys.path[0])\n")
    (tmp_path / "module_here.py").write_text("import sys\nprint(__name__, sys.argv)\n")
    for command in ([sys.executable, str(script), "x"], [sys.executable, "-m", "module_here", "y"]):
        forked = warm_python.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=60)
        fresh = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=60)
        assert forked.returncode == 0 and forked.stdout == fresh.stdout, (forked.stderr, fresh.stdout)


def test_a_forked_command_is_its_own_process_that_signals_end_and_ignored_signals_spare():
    sleeper = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"]
    process = warm_python.Popen(sleeper, stdout=subprocess.PIPE, text=True)
    assert process.forked and process.pid != os.getpid() and process.stdout.readline() == "up\n"
    with pytest.raises(subprocess.TimeoutExpired):
        process.wait(timeout=0.05)
    assert process.poll() is None
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == -signal.SIGTERM and process.poll() == -signal.SIGTERM
    process.stdout.close()

    nohup = warm_python.Popen(sleeper, stdout=subprocess.PIPE, text=True, ignored_signals=[signal.SIGHUP])
    assert nohup.stdout.readline() == "up\n"
    nohup.send_signal(signal.SIGHUP)
    with pytest.raises(subprocess.TimeoutExpired):
        nohup.wait(timeout=0.3)  # still running
    nohup.kill()
    assert nohup.wait(timeout=30) == -signal.SIGKILL
    nohup.stdout.close()


def test_the_variables_torch_reads_at_import_or_a_preexec_fn_start_a_real_subprocess():
    command = [sys.executable, "-c", "import sys; print('torch' in sys.modules)"]
    assert warm_python.run(command, capture_output=True, text=True).stdout == "True\n"  # the fork's import
    for kwargs in ({"env": {**os.environ, "OMP_NUM_THREADS": "7"}}, {"preexec_fn": os.getpid}):
        with warm_python.Popen(command, stdout=subprocess.PIPE, text=True, **kwargs) as process:
            assert not process.forked and process.communicate(timeout=60)[0] == "False\n"


@pytest.mark.parametrize("unbuffered", ["", "1"])
def test_a_forked_commands_standard_streams_are_made_for_its_own_descriptors(monkeypatch, unbuffered):
    # The server's stdout is not a terminal; the command's is, and Python line-buffers a terminal.
    monkeypatch.setattr(warm_python, "_servers", {})  # a server of this environment, importing nothing
    monkeypatch.setattr(warm_python, "PRELOADED", ())
    monkeypatch.setenv("PYTHONUNBUFFERED", unbuffered)
    command = [sys.executable, "-c", "import sys; print(sys.stdout.line_buffering, sys.stdout.write_through, "
                                     "sys.stderr.line_buffering, sys.stdout.isatty())"]
    said = []
    for module in (warm_python, subprocess):
        reader, terminal = os.openpty()
        with module.Popen(command, stdout=terminal, stderr=subprocess.DEVNULL) as process:
            os.close(terminal)
            assert process.wait(timeout=60) == 0 and getattr(process, "forked", True)
        said.append(os.read(reader, 1000))
        os.close(reader)
    assert said[0] == said[1] == (b"False True False True\r\n" if unbuffered else b"True False True True\r\n")


def test_a_signal_sent_as_soon_as_popen_returns_reaches_the_commands_own_handling():
    # A fresh Python killed before it starts dies of the signal; a fork sees it once it is the command.
    for sig in [signal.SIGTERM, signal.SIGINT] * 8:
        process = warm_python.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        process.send_signal(sig)
        assert process.wait(timeout=30) == -sig


def test_forks_draw_their_own_seeds_and_read_their_own_temporary_folder(tmp_path):
    command = [sys.executable, "-c", "import random, tempfile, torch; "
                                     "print(torch.initial_seed(), random.random(), tempfile.gettempdir())"]
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    first, second = (warm_python.run(command, capture_output=True, text=True, timeout=60, env=env).stdout.split()
                     for _ in "ab")
    assert first[0] != second[0] and first[1] != second[1] and first[2] == second[2] == str(tmp_path)


def test_a_variable_the_servers_imports_set_in_the_test_process_too_still_forks(tmp_path, monkeypatch):
    # torch._dynamo sets TORCHINDUCTOR_CACHE_DIR in every process that imports it, the tests' own too.
    (tmp_path / "sets_a_variable.py").write_text("import os\nos.environ['TORCH_SET_BY_IMPORT'] = 'x'\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.delenv("TORCH_SET_BY_IMPORT", raising=False)
    monkeypatch.setattr(warm_python, "_servers", {})
    monkeypatch.setattr(warm_python, "PRELOADED", ("sets_a_variable",))
    command = [sys.executable, "-c", "import os; print(os.environ.get('TORCH_SET_BY_IMPORT'))"]
    for value, forks in [(None, True), ("x", True), ("y", False)]:
        if value is not None:
            monkeypatch.setenv("TORCH_SET_BY_IMPORT", value)
        with warm_python.Popen(command, stdout=subprocess.PIPE, text=True) as process:
            assert process.forked == forks and process.communicate(timeout=60)[0] == f"{value or 'x'}\n"


def test_a_missing_script_or_working_folder_fails_as_with_a_fresh_python(tmp_path):
    missing = [sys.executable, str(tmp_path / "missing.py")]
    forked, fresh = (module.run(missing, capture_output=True, text=True, timeout=60)
                     for module in (warm_python, subprocess))
    assert (forked.returncode, forked.stderr) == (fresh.returncode, fresh.stderr) and fresh.returncode == 2
    for module in (warm_python, subprocess):
        with pytest.raises(FileNotFoundError):
            module.run([sys.executable, "-c", ""], cwd=tmp_path / "missing", timeout=60)
