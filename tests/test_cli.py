"""The `tinyattn` command: each subcommand reaches its module's main, an unknown one is a
one-line error naming them all, the launchers and console scripts run the same mains, and the
options the subcommands share are one helper's (one help text, one list of accepted values)."""

import argparse
import importlib
import os
import runpy
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests import warm_python
from tinyattn.cli import run_command
from tinyattn.cli.main import SUBCOMMANDS, main
from tinyattn.config import ATTENTION_PATHS, CHOICES
from tinyattn.hf.convert import DTYPES as EXPORT_DTYPES
from tinyattn.gguf.writer import GGUF_DTYPES
from tinyattn.system.choices import DEVICE_NAMES, EXPORT_PRECISIONS, GGUF_PRECISIONS, PRECISIONS

ROOT = Path(__file__).resolve().parents[1]
NAMES = ["train", "generate", "eval", "attention", "export", "lab", "serve"]
SCRIPTED = NAMES[:5]  # the commands older than `tinyattn`: a scripts/ launcher and a tinyattn-* alias each


def parser_of(name: str) -> argparse.ArgumentParser:
    module = importlib.import_module(f"tinyattn.cli.{name}")
    return (getattr(module, "parser", None) or module.build_parser)()


def option(parser: argparse.ArgumentParser, flag: str) -> argparse.Action:
    [action] = [a for a in parser._actions if flag in a.option_strings]
    return action


@pytest.fixture
def recorded_mains(monkeypatch):
    """Every subcommand's main replaced by one that records its arguments and returns 40 + its index."""
    calls = []
    for i, name in enumerate(NAMES):
        module = importlib.import_module(f"tinyattn.cli.{name}")
        def recorder(argv=None, name=name, i=i):
            calls.append((name, argv))
            return 40 + i
        monkeypatch.setattr(module, "main", recorder)
    return calls


def test_a_count_in_a_message_agrees_with_its_number():
    # "text: 1 tokens; the explorer takes at least 2", "| shape | 1 layers, ... 1 heads" in a model card
    from tinyattn.errors import counted

    assert [counted(n, "token") for n in (0, 1, 2, 32000)] == ["0 tokens", "1 token", "2 tokens",
                                                                "32,000 tokens"]
    assert (counted(1, "query", "queries"), counted(3, "query", "queries")) == ("1 query", "3 queries")


def test_a_parameter_count_is_in_millions_from_a_million_up_and_exact_below():
    from tinyattn.errors import parameter_count_text

    assert [parameter_count_text(n) for n in (35_200, 999_999, 1_000_000, 1_804_096)] == [
        "35,200", "999,999", "1.00M", "1.80M"]


def test_the_subcommands_are_the_seven_commands():
    assert list(SUBCOMMANDS) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_each_subcommand_reaches_its_main_with_the_rest_of_the_arguments(recorded_mains, name):
    status = main([name, "--checkpoint", "x", "-"])
    assert recorded_mains == [(name, ["--checkpoint", "x", "-"])]
    assert status == 40 + NAMES.index(name)  # its main's exit status is the command's


def test_an_unknown_subcommand_is_one_line_naming_every_subcommand(recorded_mains, capsys):
    assert main(["trian", "--config", "x.yaml"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and recorded_mains == []
    assert err == ("error: unknown subcommand 'trian'; expected one of train, generate, eval, attention, "
                   "export, lab, serve\n")


def test_no_subcommand_prints_the_usage_and_help_lists_every_subcommand(recorded_mains, capsys):
    assert main([]) == 2
    assert "usage: tinyattn SUBCOMMAND" in capsys.readouterr().err
    for flag in ("--help", "-h"):
        assert main([flag]) == 0
        out = capsys.readouterr().out
        assert all(f"  {name} " in out for name in NAMES) and recorded_mains == []


def test_python_dash_m_tinyattn_is_the_command():
    result = subprocess.run([sys.executable, "-m", "tinyattn", "nope"], capture_output=True, text=True,
                            timeout=60, cwd=ROOT)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == f"error: unknown subcommand 'nope'; expected one of {', '.join(NAMES)}\n"


@pytest.mark.parametrize("name", SCRIPTED)
def test_the_script_launches_the_subcommands_main(recorded_mains, name):
    with pytest.raises(SystemExit) as exit:
        runpy.run_path(str(ROOT / "scripts" / f"{name}.py"), run_name="__main__")
    assert exit.value.code == 40 + NAMES.index(name) and recorded_mains == [(name, None)]


def test_a_script_runs_its_own_checkouts_tinyattn_installed_or_not(tmp_path):
    import shutil

    for folder in ("tinyattn", "scripts"):  # another checkout, while this one is the installed tinyattn
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    with open(tmp_path / "tinyattn" / "__init__.py", "a") as f:
        f.write("\nimport sys\nsys.stderr.write('the other checkout\\n')\n")
    result = subprocess.run([sys.executable, str(tmp_path / "scripts" / "eval.py"), "--help"],
                            capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert result.returncode == 0 and result.stderr == "the other checkout\n", result.stderr
    assert "usage: tinyattn eval" in result.stdout


def test_the_console_scripts_are_the_command_and_the_old_names_as_aliases():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    assert scripts.pop("tinyattn") == "tinyattn.cli.main:main"
    assert scripts == {f"tinyattn-{name}": f"tinyattn.cli.{name}:main" for name in SCRIPTED}


# ----------------------------------------------------------------------------- shared options


@pytest.mark.parametrize("name", NAMES)
def test_each_subcommands_usage_names_it(name):
    assert parser_of(name).prog == f"tinyattn {name}"


def test_every_device_option_has_one_help_naming_what_check_device_accepts():
    helps = {name: option(parser_of(name), "--device").help for name in SCRIPTED if name != "export"}
    assert helps.pop("train") == f"overrides train.device: {DEVICE_NAMES}"
    assert set(helps.values()) == {f"{DEVICE_NAMES} (default: auto)"}
    assert DEVICE_NAMES == "auto, cpu, cuda, cuda:N or mps"


def test_every_checkpoint_option_is_the_same_helper():
    helps = {name: option(parser_of(name), "--checkpoint").help for name in SCRIPTED if name != "train"}
    assert helps.pop("generate").endswith("the most recent run under --out-dir")
    assert len(set(helps.values())) == 1 and "Hugging Face folder (Llama or Qwen3" in helps["eval"]


def test_the_choices_are_the_librarys_own():
    assert option(parser_of("generate"), "--dtype").choices == PRECISIONS == CHOICES["train.precision"]
    assert tuple(EXPORT_DTYPES) == EXPORT_PRECISIONS and GGUF_DTYPES == GGUF_PRECISIONS
    assert option(parser_of("export"), "--dtype").choices == sorted(set(EXPORT_PRECISIONS) | set(GGUF_PRECISIONS))
    assert f"model.attention={'|'.join(ATTENTION_PATHS)}" in option(parser_of("train"), "--set").help


def test_set_given_more_than_once_keeps_every_override_in_order():
    # --set's help: "may be repeated"; argparse's default action keeps only the last one given.
    args = parser_of("train").parse_args(["--config", "c.yaml", "--set", "train.lr=1e-3", "model.n_layer=2",
                                          "--set", "train.max_steps=5"])
    assert args.overrides == ["train.lr=1e-3", "model.n_layer=2", "train.max_steps=5"]
    assert parser_of("train").parse_args(["--config", "c.yaml"]).overrides == []


def test_generate_and_serve_look_for_runs_where_train_writes_them_and_pick_the_dtype_by_default():
    from tinyattn.train.loop import DEFAULT_OUT_DIR

    for name in ("generate", "serve"):  # the commands whose --checkpoint defaults to the newest run
        defaults = parser_of(name).parse_args([])
        assert (defaults.out_dir, defaults.dtype) == (DEFAULT_OUT_DIR, "auto"), name


@pytest.mark.parametrize("argv0, expected", [
    ("scripts/train.py", "python scripts/train.py"),  # as the user wrote it, from the checkout
    (str(ROOT / "scripts" / "generate.py"), f"python {ROOT / 'scripts' / 'train.py'}"),  # another script
    ("/home/me/project/scripts/mine.py", "tinyattn train"),  # a script of the user's: no train.py beside it
    (str(ROOT / "tinyattn" / "cli" / "generate.py"), "tinyattn train"),  # train.py beside it, not in scripts/
    ("/venv/bin/tinyattn", "tinyattn train"),
    ("/venv/lib/python3.12/site-packages/tinyattn/__main__.py", "tinyattn train"),  # python -m tinyattn
])
def test_the_commands_messages_print_are_the_ones_this_process_was_started_with(monkeypatch, tmp_path,
                                                                                argv0, expected):
    from tinyattn import checkpoint as ckpt
    from tinyattn.errors import CheckpointError

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "argv", [argv0, "generate"])
    with pytest.raises(CheckpointError, match=f"train a model first: {expected} --config"):
        ckpt.resolve_checkpoint(None, tmp_path)


@pytest.mark.parametrize("argv0, world, expected", [
    ("scripts/train.py", {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"},
     "torchrun --nproc_per_node=2 scripts/train.py"),
    ("/venv/lib/python3.12/site-packages/tinyattn/__main__.py", {"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"},
     "torchrun --nnodes=2 --nproc_per_node=4 -m tinyattn train"),
    ("scripts/train.py", {"WORLD_SIZE": "1"}, "python scripts/train.py"),
    ("scripts/train.py", {"WORLD_SIZE": "2"}, "torchrun --nproc_per_node=2 scripts/train.py"),  # one node
])
def test_a_data_parallel_training_is_told_to_resume_under_torchrun_as_it_started(monkeypatch, argv0, world,
                                                                                 expected):
    # In one process the resume would train on with 1/N of the batch it was trained with.
    from tinyattn.system.invocation import command

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "argv", [argv0, "--resume", "x"])
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)  # torchrun's, where a case gives none
    for key, value in world.items():
        monkeypatch.setenv(key, value)
    assert command("train") == expected
    assert not command("generate").startswith("torchrun")  # only a training is launched so


def test_run_command_turns_a_user_mistake_into_one_line(capsys):
    from tinyattn.errors import ConfigError

    def command():
        raise ConfigError("x.yaml: train.lr: -1 is not accepted")

    assert run_command(command) == 2
    assert capsys.readouterr().err == "error: x.yaml: train.lr: -1 is not accepted\n"


def test_an_os_error_other_than_a_name_too_long_is_a_bug_and_keeps_its_traceback():
    # Only a name over 255 bytes is the user's mistake; any other OSError said "a name may have at most
    # 255 bytes" of a path whose name was fine.
    def command():
        raise PermissionError(13, "Permission denied", "/root/run")

    with pytest.raises(PermissionError):
        run_command(command)


def test_a_mistake_still_ends_with_status_2_where_standard_error_is_gone(monkeypatch):
    # `tinyattn train ... 2>&-` or a closed terminal: the line has nowhere to go, the status still says it.
    from tinyattn.errors import ConfigError

    class Gone:
        def write(self, text):
            raise OSError(5, "Input/output error")

        def flush(self):
            raise OSError(5, "Input/output error")

    def command():
        raise ConfigError("x.yaml: train.lr: -1 is not accepted")

    monkeypatch.setattr(sys, "stderr", Gone())
    assert run_command(command) == 2


def test_a_rank_waiting_for_rank_0s_line_stays_until_torchrun_ends_it():
    # A rank that ended at once made torchrun stop rank 0, sometimes before its line was said.
    import signal

    child = ("from tinyattn.cli import run_command\n"
             "from tinyattn.errors import TinyattnError\n"
             "def command():\n"
             "    error = TinyattnError('--set: train.max_steps: expected an integer')\n"
             "    error.shared = True\n"
             "    raise error\n"
             "print('ready', flush=True)\n"
             "run_command(command)\n")
    env = {**os.environ, "RANK": "1", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "none", "GROUP_RANK": "0",
           "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env=env, cwd=ROOT)
    try:
        assert process.stdout.readline() == b"ready\n"
        with pytest.raises(subprocess.TimeoutExpired):
            process.wait(timeout=0.5)  # still waiting
        process.terminate()  # torchrun's SIGTERM, once rank 0 has exited
        assert process.wait(timeout=30) == -signal.SIGTERM
        assert process.stderr.read() == b""  # rank 0's line alone
    finally:
        process.kill()
        process.wait()


def test_a_rank_whose_peer_left_ends_at_once_after_its_line_without_unwinding():
    """distributed.PeerGone: freeing the frames that hold the DDP wrapper joins gloo's worker threads
    with the GIL held while one of them waits for it to free the failed collective's work: the rank
    hung after its line, now and then under load, until torchrun killed it. Its line and exit
    status stay; nothing the frames hold is freed."""
    child = ("import sys\n"
             "from tinyattn.cli import run_command\n"
             "from tinyattn.system.distributed import PeerGone\n"
             "class Held:\n"
             "    def __del__(self): print('unwound', flush=True)\n"
             "def command():\n"
             "    held = Held()  # stands in for the DDP wrapper\n"
             "    raise PeerGone('another rank left the run; every rank stops')\n"
             "code = run_command(command)\n"
             "print('code', code)\n"
             "raise SystemExit(code)\n")
    for world, unwound in (("2", ""), ("1", "unwound\ncode 2\n")):  # in-process callers unwind
        result = warm_python.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60,
                                 cwd=ROOT, env={**os.environ, "RANK": "1", "WORLD_SIZE": world})
        assert (result.returncode, result.stdout) == (2, unwound), (result.stdout, result.stderr)
        assert result.stderr == "rank 1: error: another rank left the run; every rank stops\n", result.stderr


SAID = "stopped by SIGINT before step 1"


@pytest.mark.parametrize("message, line", [(SAID, SAID), ("", "interrupted")], ids=["said", "plain"])
def test_an_interrupted_command_exits_130_with_one_line(message, line, capsys):
    # 128 + SIGINT, as a shell reports Ctrl-C; a training stopped before its first step says so.
    def command():
        raise KeyboardInterrupt(message)

    assert run_command(command) == 130
    assert capsys.readouterr().err == f"{line}\n"

@pytest.mark.parametrize("rank, printed", [("0", True), ("1", False)])
def test_under_torchrun_rank_0_alone_prints_the_last_line_and_every_rank_keeps_the_exit_status(
        monkeypatch, capsys, rank, printed):
    """Each rank meets the same mistake or stop: one line on the console, not one per process."""
    from tinyattn.errors import ConfigError

    def mistake():
        raise ConfigError("x.yaml: train.lr: -1 is not accepted")

    def stop():
        raise KeyboardInterrupt(SAID)

    def shared():
        error = ConfigError("data.files: file not found: x.txt")
        error.shared = True  # rank 0's refusal passed on (distributed.refusal_shared)
        raise error

    monkeypatch.setenv("RANK", rank)
    assert run_command(shared) == 2 and run_command(stop) == 130
    expected = f"error: data.files: file not found: x.txt\n{SAID}\n" if printed else ""
    assert capsys.readouterr().err == expected
    # An error a rank met by itself (its GPU's memory, its losses) is said by that rank, named
    assert run_command(mistake) == 2
    own = "" if printed else f"rank {rank}: "
    assert capsys.readouterr().err == f"{own}error: x.yaml: train.lr: -1 is not accepted\n"


def test_a_command_freezes_what_is_alive_at_exit_so_teardown_skips_collecting_it():
    # The interpreter's last collection walks every object importing torch made (over a second
    # per command here, docs/BENCHMARKS.md "Start-up"); frozen objects are skipped. A real
    # process: its exit handlers run as at any exit, the one registered first last of all.
    child = ("import atexit, gc, sys\n"
             "atexit.register(lambda: print(gc.get_freeze_count(), file=sys.stderr))  # after the command's\n"
             "from tinyattn.cli import run_command\n"
             "assert run_command(lambda: 0) == 0 and gc.get_freeze_count() == 0  # not before the exit\n")
    result = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert int(result.stderr) > 1000  # every object still alive at exit


def test_under_torchrun_a_rank_leaves_a_mistake_every_rank_met_to_rank_0_and_waits_to_be_ended(
        monkeypatch, capsys):
    """`--set train.max_steps=null` under torchrun: every rank meets it, rank 0 alone says it. Rank 1,
    ending first, made torchrun SIGTERM rank 0, sometimes before its line (1 in 6: no word at all).
    Now such a rank waits for torchrun's SIGTERM, with the default handler; rank 0, a rank's own
    error, a stop, a machine other than rank 0's and a launcher other than torchrun end at once."""
    import signal

    import tinyattn.cli as cli
    from tinyattn.errors import TinyattnError

    waited = []
    monkeypatch.setattr(cli.time, "sleep", waited.append)
    monkeypatch.setattr(signal, "signal", lambda sig, handler: waited.append((sig, handler)))

    def mistake(shared=True, stop_seen=False):
        error = TinyattnError("--set: train.max_steps: expected an integer")
        error.shared, error.stop_seen = shared, stop_seen
        raise error

    def stopped():
        raise KeyboardInterrupt("stopped before step 1")

    for key, value in (("RANK", "1"), ("WORLD_SIZE", "2"), ("TORCHELASTIC_RUN_ID", "none")):
        monkeypatch.setenv(key, value)
    assert run_command(mistake) == 2
    assert waited == [(signal.SIGTERM, signal.SIG_DFL), cli.RANK_0_LINE_WAIT]
    assert capsys.readouterr().err == ""
    waited.clear()
    assert run_command(lambda: mistake(shared=False)) == 2  # its own: it says it, and ends
    assert run_command(stopped) == 130  # torchrun, stopping its workers, waits for them
    monkeypatch.setenv("RANK", "0")
    assert run_command(mistake) == 2
    assert "error: --set: train.max_steps" in capsys.readouterr().err
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("GROUP_RANK", "1")  # another machine's torchrun, which never sees rank 0 exit
    assert run_command(mistake) == 2
    monkeypatch.setenv("GROUP_RANK", "0")
    assert run_command(lambda: mistake(stop_seen=True)) == 2  # torchrun, stopping, signalled it already
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")  # a user's own launcher: no one would end the wait
    assert run_command(mistake) == 2
    assert waited == []


def test_torchruns_sigint_ends_a_ranks_wait_for_rank_0s_line_without_a_traceback(monkeypatch, capsys):
    """Ctrl-C to torchrun while a rank waits for rank 0 to say a mistake every rank met: torchrun passes
    SIGINT on to its workers, whose KeyboardInterrupt in the wait printed rank 1's traceback (and the
    mistake's, chained). The wait ends quietly, the status the mistake's."""
    import tinyattn.cli as cli
    from tinyattn.errors import TinyattnError

    def interrupted(seconds):
        raise KeyboardInterrupt

    def mistake():
        error = TinyattnError("--stop-at-step 0: the run is already at step 0; give a later step")
        error.shared = True
        raise error

    monkeypatch.setattr(cli.time, "sleep", interrupted)
    monkeypatch.setattr(cli.signal, "signal", lambda sig, handler: None)
    for key, value in (("RANK", "1"), ("WORLD_SIZE", "2"), ("TORCHELASTIC_RUN_ID", "none"),
                       ("GROUP_RANK", "0")):
        monkeypatch.setenv(key, value)
    assert run_command(mistake) == 2
    assert capsys.readouterr().err == ""


def test_a_reader_that_goes_away_ends_the_command_quietly_with_status_141():
    # `tinyattn generate ... | head`: what is left to print has nowhere to go. Not a traceback.
    child = ("import sys\n"
             "from tinyattn.cli import run_command\n"
             "def command():\n"
             "    while True:\n"
             "        print('x' * 1000, flush=True)\n"
             "sys.exit(run_command(command))\n")
    process = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               cwd=ROOT)
    process.stdout.read(10)
    process.stdout.close()  # the reader is gone
    err = process.stderr.read()
    assert process.wait(timeout=60) == 141 and err == b"", err


# ----------------------------------------------------------------------------- argument checks


def test_train_without_device_keeps_the_configs_train_device():
    assert parser_of("train").parse_args(["--config", "c.yaml"]).device is None  # train.device decides
    assert parser_of("train").parse_args(["--config", "c.yaml", "--device", "cpu"]).device == "cpu"
    assert parser_of("eval").parse_args([]).device == "auto"


def test_a_warning_during_training_is_one_line_as_generate_and_serve_print_them(monkeypatch, capsys):
    """E.g. a resume under another number of processes than the run's (trainer.load_state_dict):
    `warning: <message>`, not Python's `UserWarning` with its file, line and source line."""
    import warnings

    import tinyattn.train.loop
    from tinyattn.cli.train import main as train_main

    class Result:
        interrupted = False

    def train(config, **options):
        warnings.warn("step_0000004.pt was written by 2 process(es), this run has 1", UserWarning)
        return Result()

    monkeypatch.setattr(tinyattn.train.loop, "train", train)
    assert train_main(["--config", str(ROOT / "configs" / "tiny.yaml")]) == 0
    assert capsys.readouterr().err == "warning: step_0000004.pt was written by 2 process(es), this run has 1\n"


def options_given_to_the_loop(monkeypatch, argv: list[str]) -> dict:
    """The keyword arguments `tinyattn train ARGV` hands `tinyattn.train.loop.train` (which is faked)."""
    import tinyattn.train.loop
    from tinyattn.cli.train import main as train_main

    class Result:
        interrupted = False

    given = {}

    def train(config, **options):
        given.update(options)
        return Result()

    monkeypatch.setattr(tinyattn.train.loop, "train", train)
    assert train_main(["--config", str(ROOT / "configs" / "tiny.yaml"), *argv]) == 0
    return given


def test_train_counts_the_processes_start_up_against_the_time_budget(monkeypatch):
    """README: the main config's run ends at about 590 s of its 10 minutes, start-up included: the
    command hands the process's age to the loop (elapsed_before), which counted from zero without it."""
    import tinyattn.system.timing

    monkeypatch.setattr(tinyattn.system.timing, "process_age", lambda: 12.5)
    assert options_given_to_the_loop(monkeypatch, [])["elapsed_before"] == 12.5


def test_train_no_progress_reaches_the_loop(monkeypatch):
    assert options_given_to_the_loop(monkeypatch, [])["progress"] is True
    assert options_given_to_the_loop(monkeypatch, ["--no-progress"])["progress"] is False


@pytest.mark.parametrize("interrupted, status", [(False, 0), (True, 130)])
def test_a_training_stopped_by_ctrl_c_or_sigterm_with_its_checkpoint_exits_130(monkeypatch, interrupted,
                                                                                status):
    # The loop returns (a checkpoint saved, its line said) rather than raising: the status says it stopped.
    import tinyattn.train.loop
    from tinyattn.cli.train import main as train_main

    monkeypatch.setattr(tinyattn.train.loop, "train",
                        lambda config, **options: SimpleNamespace(interrupted=interrupted))
    assert train_main(["--config", str(ROOT / "configs" / "tiny.yaml")]) == status


def test_under_torchrun_a_config_mistake_is_said_by_rank_0_alone(monkeypatch, capsys):
    # Every rank reads the same config: one line on the console, not `rank 1: error: ...` beside it.
    from tinyattn.cli.train import main as train_main

    argv = ["--config", str(ROOT / "configs" / "tiny.yaml"), "--set", "train.lr=-1"]
    monkeypatch.setenv("RANK", "0")
    assert train_main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "train.lr" in err and err.count("\n") == 1, err
    monkeypatch.setenv("RANK", "1")
    assert train_main(argv) == 2
    assert capsys.readouterr().err == ""


def test_train_without_config_or_resume_is_a_usage_error(capsys):
    from tinyattn.cli.train import main as train_main

    with pytest.raises(SystemExit) as exit:
        train_main(["--set", "train.max_steps=5"])
    assert exit.value.code == 2
    assert "error: --config is required (or --resume to continue a run)" in capsys.readouterr().err


def test_allow_data_change_without_resume_is_a_usage_error(capsys):
    from tinyattn.cli.train import main as train_main

    with pytest.raises(SystemExit) as exit:
        train_main(["--config", "configs/tiny.yaml", "--allow-data-change"])
    assert exit.value.code == 2
    assert "error: --allow-data-change lets a resumed run go on over changed data: give it with --resume" \
        in capsys.readouterr().err


def test_init_from_a_folder_that_is_not_there_names_the_hugging_face_folder_it_could_be(tmp_path, capsys):
    """configs/finetune_example.yaml before its model is downloaded: the error said 'no such checkpoint
    file or run folder', leaving out the Hugging Face folder the config names and how one gets there."""
    from tinyattn.cli.train import main as train_main

    missing = tmp_path / "models" / "SmolLM2-135M"
    code = train_main(["--config", "configs/tiny.yaml", "--no-progress", "--set", f"train.out_dir={tmp_path}",
                       f"train.init_from={missing}"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert (f"error: train.init_from: {missing}: no such checkpoint file, run folder or Hugging Face folder "
            "(a Hugging Face model is read from a local folder: download it first") in err
    assert not list(tmp_path.iterdir())  # no run folder is made


@pytest.mark.parametrize("config", [[], ["--config", "configs/tiny.yaml"]], ids=["no-config", "config"])
def test_resume_without_config_looks_for_the_run_under_the_out_dir_set_gives(tmp_path, capsys, config):
    # With --config too, its train.out_dir (here from --set), not the default checkpoints/.
    from tinyattn.cli.train import main as train_main

    assert train_main([*config, "--resume", "--run-name", "gone", "--set", f"train.out_dir={tmp_path}"]) == 2
    expected = f"error: {tmp_path / 'gone'}: no such run to resume (check --run-name)\n"
    assert capsys.readouterr().err == expected  # not checkpoints/gone


@pytest.mark.parametrize("name, argv, message", [
    ("eval", ["--batch-size", "0"], "--batch-size 0: expected a positive integer"),
    ("export", ["--gguf", "m.gguf", "--out", "m.gguf"], "--gguf FILE stands for --format gguf --out FILE: "
                                                          "give one or the other"),
    ("export", ["--gguf", "m.gguf", "--format", "hf"], "--gguf FILE stands for --format gguf --out FILE"),
    ("export", [], "--out: the folder (or with --format gguf, the file) to write is required"),
])
def test_a_bad_option_is_one_line_before_any_checkpoint_is_read(name, argv, message, capsys):
    module = importlib.import_module(f"tinyattn.cli.{name}")
    assert module.main(["--checkpoint", "no/such/run", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {message}") and err.count("\n") == 1, err


def test_a_prompts_byte_order_mark_is_dropped_from_a_file_stdin_and_the_first_interactive_line(
        tmp_path, monkeypatch):
    import io

    from tinyattn.cli import generate as generate_cli

    path = tmp_path / "prompt.txt"
    path.write_bytes(b"\xef\xbb\xbfROMEO:")  # as a Windows editor saves UTF-8
    parsed = generate_cli.build_parser().parse_args(["--prompt-file", str(path)])
    assert generate_cli.read_prompt(parsed) == "ROMEO:"
    monkeypatch.setattr(sys, "stdin", io.StringIO("\ufeffROMEO:"))
    from_stdin = generate_cli.build_parser().parse_args(["--prompt-file", "-"])
    assert generate_cli.read_prompt(from_stdin) == "ROMEO:"
    monkeypatch.setattr(sys, "stdin", io.StringIO("\ufeffROMEO:\n\ufeffJULIET:\n"))
    ran = []
    generate_cli._interactive(argparse.Namespace(run=lambda line, echo: ran.append(line)))
    assert ran == ["ROMEO:", "\ufeffJULIET:"]  # only the first line can start with the file's mark


PATH_METAVARS = {"FILE", "DIR", "PATH", "PNG", "RUN_DIR|FILE", "DIR|FILE", "RUN_DIR|CHECKPOINT"}


def path_options() -> list[tuple[str, argparse.Action]]:
    """(command, action) of every option of every subcommand whose value is a file or folder."""
    found = []
    for name in SUBCOMMANDS:
        module = importlib.import_module(f"tinyattn.cli.{name}")
        parsers = [(name, (getattr(module, "parser", None) or module.build_parser)())]
        while parsers:
            command, parser = parsers.pop()
            for action in parser._actions:
                if isinstance(action, argparse._SubParsersAction):  # a lab experiment's, when asked for
                    parsers += [(f"{command} {sub}", getattr(p, "add_options", lambda p=p: p)())
                                for sub, p in action.choices.items()]
                elif action.option_strings and action.metavar in PATH_METAVARS:
                    found.append((command, action))
    return found


def test_every_path_option_written_with_a_tilde_after_an_equals_sign_is_under_the_home_folder(
        tmp_path, monkeypatch):
    # `--out=~/x`: no shell expands a tilde after "=", so the command made a folder named "~" where it
    # was run (a footgun: `rm -rf ~`) or looked for "~/run" there: "no checkpoint at ~/run".
    monkeypatch.setenv("HOME", str(tmp_path))
    options = path_options()
    names = {(command, action.option_strings[0]) for command, action in options}
    assert {("export", "--out"), ("train", "--resume"), ("lab distance", "--text"),
            ("serve", "--checkpoint"), ("attention", "--out-dir"), ("eval", "--plot")} <= names
    assert len(options) > 20
    for command, action in options:
        value = action.type("~/x") if action.type else "~/x"
        assert str(value) == str(tmp_path / "x"), (command, action.option_strings)
    # eval --plot=~/plots/ (metavar PNG) was missed: its plot went into ./~/plots/.
    plot = importlib.import_module("tinyattn.cli.eval").parser().parse_args(["--plot=~/plots/"]).plot
    assert plot == f"{tmp_path}/plots/"  # the slash that says it is a folder kept


def test_an_export_given_its_checkpoint_and_out_after_equals_signs_with_tildes_writes_under_home(
        trained_run, tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / "runs").mkdir(parents=True)
    (home / "runs" / "tiny").symlink_to(trained_run.run_dir)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    assert main(["export", "--checkpoint=~/runs/tiny", "--out=~/exported"]) == 0
    assert (home / "exported" / "config.json").is_file() and not (tmp_path / "~").exists()


def python_env(buffered: bool) -> dict:
    """This process's environment, with stdout block-buffered (as in a terminal's shell, where
    PYTHONUNBUFFERED is rarely set) or unbuffered."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONUNBUFFERED"}
    return env if buffered else {**env, "PYTHONUNBUFFERED": "1"}


@pytest.mark.parametrize("buffered", [True, False])
@pytest.mark.parametrize("args", [["--help"], ["train", "--help"]])
def test_the_usage_to_a_reader_that_went_away_ends_quietly_with_status_141(args, buffered):
    # `tinyattn --help | head -1`: the usage is the one text main prints itself, outside any
    # subcommand's run_command; it was a BrokenPipeError traceback. The pipe's reader is closed
    # before the command starts, so its first write fails. Buffered, the write went into the buffer
    # and failed at exit: "Exception ignored ... BrokenPipeError", status 120 (argparse's --help too).
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run([sys.executable, "-m", "tinyattn", *args], stdout=write_end,
                                stderr=subprocess.PIPE, timeout=60, cwd=ROOT, env=python_env(buffered))
    finally:
        os.close(write_end)
    assert result.returncode == 141 and result.stderr == b"", result.stderr


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux's /dev/full")
@pytest.mark.parametrize("buffered", [True, False])
@pytest.mark.parametrize("args", [["--help"], ["train", "--help"], ["lab", "causal", "--help"]])
def test_a_usage_that_standard_output_cannot_take_is_one_error_line_and_status_2(args, buffered):
    # `tinyattn --help > /dev/full`: the top-level usage was an OSError traceback (unbuffered) or an
    # "Exception ignored" line and status 120 at exit (buffered); argparse's --help ignored the failed
    # write (unbuffered: nothing said, status 0) or failed at exit alike.
    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, "-m", "tinyattn", *args], stdout=full,
                                stderr=subprocess.PIPE, text=True, timeout=60, cwd=ROOT,
                                env=python_env(buffered))
    assert (result.returncode, result.stderr) == (2, "error: cannot write to standard output: "
                                                     "No space left on device\n")


@pytest.mark.parametrize("args, stream, status", [(["--help"], "stdout", 0),
                                                  (["train", "--help"], "stdout", 0), ([], "stderr", 2)])
def test_a_usage_for_a_stream_the_process_was_started_without_is_not_written(monkeypatch, args, stream,
                                                                              status):
    # `tinyattn --help >&-`, `tinyattn 2>&-`: Python's sys.stdout (sys.stderr) is None, which print() and
    # argparse write nothing to; writing the usage there was an AttributeError traceback and status 1.
    monkeypatch.setattr(sys, stream, None)
    try:
        returned = main(args)
    except SystemExit as e:  # argparse's --help
        returned = e.code
    assert returned == status


def test_a_checkout_path_with_a_space_is_quoted_in_the_command_a_message_prints(monkeypatch, tmp_path):
    from tinyattn.system.invocation import command

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    scripts = tmp_path / "my checkout" / "scripts"
    scripts.mkdir(parents=True)
    for name in ("train.py", "generate.py"):
        (scripts / name).write_text("", encoding="utf-8")
    monkeypatch.setattr(sys, "argv", [str(scripts / "generate.py")])
    assert command("train") == f"python '{scripts / 'train.py'}'"


def test_a_lab_experiment_imports_its_own_module_alone_and_adds_its_options_once(monkeypatch):
    # `tinyattn lab --help` imported no experiment (distance and recurrence import torch: seconds before
    # a usage line); a parser that parsed once must parse again, not meet its options a second time.
    import tinyattn.cli.lab as lab_cli

    imported = []
    monkeypatch.setattr(lab_cli, "importlib", SimpleNamespace(
        import_module=lambda name: imported.append(name) or importlib.import_module(name)))
    p = lab_cli.parser()
    p.format_help()
    assert imported == []
    first, again = p.parse_args(["distance"]), p.parse_args(["distance", "--seed", "1"])
    assert imported == ["tinyattn.lab.distance"]
    assert first.experiment == again.experiment == "distance" and again.seed == 1
