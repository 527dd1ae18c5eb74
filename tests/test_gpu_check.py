"""benchmarks/gpu_check.sh's helpers read what a run writes, and a summary survives missing pieces.

The GPU check runs once, on a lent machine, far from this suite: these keep the parsing it
relies on (train.log's lines, TensorBoard's tags) in step with what training writes.
"""

import importlib.util
import json
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def report():
    path = ROOT / "benchmarks" / "gpu_check_report.py"
    spec = importlib.util.spec_from_file_location("gpu_check_report", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_runs_curve_wall_time_and_time_to_target_are_read_from_its_folder(report, trained_run):
    reachable = trained_run.best_val_loss + 0.01  # the one validation (step 30) is under it
    figures = report.run_figures(trained_run.run_dir, target_loss=reachable)
    assert figures["validation"] == [[30, pytest.approx(trained_run.last_val_loss, abs=1e-4)]]
    done, seconds = figures["done"], trained_run.seconds
    assert done["steps"] == 30 and done["wall_seconds"] == float(f"{trained_run.wall_seconds:.1f}")
    assert done["split_seconds"] == {name: pytest.approx(seconds[name], abs=0.051) for name in seconds}
    assert done["tokens_per_second"] == pytest.approx(trained_run.tokens_per_second, abs=0.51)
    assert done["best_val_loss"] == pytest.approx(trained_run.best_val_loss, abs=1e-4)
    assert figures["target_reached_at_step"] == 30
    tensorboard = figures["tensorboard"]
    assert [row[:2] for row in tensorboard["val_loss"]] == [[30, pytest.approx(trained_run.last_val_loss)]]
    # from the first logged training loss to the validation at step 30: inside the run's training time
    assert 0 < tensorboard["seconds_to_target"] == tensorboard["val_loss"][0][2] < trained_run.wall_seconds
    assert [row[0] for row in tensorboard["train_loss"]] == [5, 10, 15, 20, 25, 30]  # every log_interval

    unreachable = report.run_figures(trained_run.run_dir, target_loss=trained_run.best_val_loss - 0.01)
    assert unreachable["target_reached_at_step"] is None
    assert unreachable["tensorboard"]["seconds_to_target"] is None


SPEED_UP = 10.0


def test_a_budget_runs_measuring_line_is_read_from_its_log(report, corpus_text, tmp_path):
    """The calibration's line as training writes it (the report read none since it gained 'about',
    nor since it split the start-up from the measuring)."""
    from tests.conftest import local_corpus
    from tinyattn.config import load_config
    from tinyattn.train.loop import train

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(corpus_text, encoding="utf-8")
    config = load_config(ROOT / "configs" / "tiny.yaml",
                         [*local_corpus(corpus, tmp_path), "train.time_budget=1h"])
    # The run's clock runs SPEED_UP times the real one: the calibration times steps for a fraction of
    # its seconds, and writes its line as ever. A budget of an hour: start-up in a process that has
    # yet to import torch._dynamo, sped up too, leaves most of it.
    train(config, run_name="budget", progress=False, stop_at_step=1,
          clock=lambda: time.perf_counter() * SPEED_UP)
    budget = report.run_figures(tmp_path / "budget", target_loss=None)["budget"]
    assert budget["budget"] == "1h" and budget["steps"] > 1 and budget["step_seconds"] > 0
    assert budget["startup_seconds"] >= 0 and budget["measuring_seconds"] >= 1  # timed steps: 1.5 s or more


def test_the_summary_reports_a_missing_or_broken_piece_instead_of_failing(report, tmp_path):
    (tmp_path / "json").mkdir()
    steps = [{"name": "env", "status": "ok", "seconds": 3},
             {"name": "train-124m", "status": "timed out after 200 s", "seconds": 200}]
    (tmp_path / "steps.jsonl").write_text("".join(json.dumps(step) + "\n" for step in steps))
    (tmp_path / "json" / "env.json").write_text("{not json")
    (tmp_path / "json" / "train-124m.json").write_text(json.dumps({"training": [{"precision": "bf16"}]}))
    result, lines = report.summary(tmp_path)
    assert "error" in result["figures"]["env"]
    assert any(line.startswith("training: cannot summarise (KeyError") for line in lines)
    assert "train-124m timed out after 200 s (200 s)" in lines[-2]
    assert lines[-1].startswith("not measured: multi-GPU NCCL")


def test_the_follow_up_plans_summary_names_no_machine_it_did_not_measure_and_lists_the_main_run(report, tmp_path):
    (tmp_path / "json").mkdir()  # GPU_CHECK_PLAN=runs: no env step, a main-config run beside the baby ones
    (tmp_path / "json" / "main-60s.json").write_text(json.dumps({"best_val_loss": 1.5233, "target_loss": 1.47,
                                                                 "done": {"steps": 704}}))
    _, lines = report.summary(tmp_path)
    assert not any(line.startswith("machine:") for line in lines)
    assert any(line.startswith("main-60s: best validation loss 1.5233 (target 1.47: not reached); 704 steps")
               for line in lines)


def test_the_script_parses():
    subprocess.run(["bash", "-n", str(ROOT / "benchmarks" / "gpu_check.sh")], check=True)


def test_the_summary_says_where_datasets_came_from(report, monkeypatch):
    import datasets

    site_packages = str(Path(datasets.__file__).resolve().parents[1])
    monkeypatch.setenv("SITE", site_packages)  # as if gpu_check.sh had installed it there from the wheels
    assert report._datasets_origin() == "the wheels"
    monkeypatch.setenv("SITE", "/nonexistent/site")  # the machine had its own datasets: no wheel proved
    assert report._datasets_origin() == site_packages


def test_each_target_is_met_at_exactly_its_bound(report):
    # 60 s to a validation of 1.47 and an MFU of 45% are what issue 14 asks for: reaching them meets them.
    figures = {"baby": {"best_val_loss": 1.46, "tensorboard": {"seconds_to_target": 60}},
               "train-124m": {"training": [{"compile": True, "mfu": 0.45, "peak_flops": 1e15,
                                            "flops_per_token": 1e9, "tokens_per_second": 1.0}]},
               "decode-124m": [{"batch_size": 1, "cached_tokens_per_s": 1500, "compile": True}]}
    met = {name: target["met"] for name, target in report.targets(figures).items()}
    assert list(met.values()) == [True, True, True], met


def test_the_mfu_denominator_is_a_matmul_over_2048_never_the_2048_one(report):
    train = {"training": [{"compile": True, "mfu": 0.5, "peak_flops": 1e15, "flops_per_token": 1e9,
                           "tokens_per_second": 1e5}]}
    [only_2048] = report.targets({"train-124m": train, "peak": {"flops": {"2048": 1e14}}}).values()
    assert only_2048["matmul_8192_flops"] is None and only_2048["met"]  # the bench's own peak, 0.5
    [larger] = report.targets({"train-124m": train, "peak": {"flops": {"2048": 1e14, "8192": 4e14}}}).values()
    assert larger["mfu_vs_8192_matmul"] == 0.25 and not larger["met"]  # 1e9 x 1e5 / 4e14


def test_the_pytest_counts_pass_only_what_did_not_fail_error_or_skip(report, tmp_path):
    xml = tmp_path / "pytest.xml"
    xml.write_text('<testsuites><testsuite tests="6" failures="1" errors="1" skipped="1">'
                   '<testcase classname="t" name="a"><failure/></testcase>'
                   '<testcase classname="t" name="b"><error/></testcase></testsuite></testsuites>')
    counts = report._pytest_counts(xml)
    assert (counts["tests"], counts["passed"], counts["failed"]) == (6, 3, ["t::a", "t::b"])


def test_a_budget_runs_plan_is_set_beside_the_step_time_it_took(report, trained_run, tmp_path):
    """Whether a GPU run's plan timed its steps without a sync shows as a ratio well under 1."""
    from tinyattn.config import TrainConfig
    from tinyattn.train.budget import TimePlan

    plan = TimePlan("10m", TrainConfig(), lambda: 12.0)
    plan.seed(0.02, 0.5, 0.1)  # the note's format is the plan's own
    first = plan.note(10)
    plan.seed(0.005, 0.5, 0.1)  # the last note's step time is the one the plan ended with
    log = (trained_run.run_dir / "train.log").read_text()
    (tmp_path / "train.log").write_text(f"{first}\n{plan.note(30)}\n{log}")
    figures = report.run_figures(tmp_path, target_loss=None)
    taken = trained_run.seconds["train"] / 30
    assert figures["plan_check"]["planned_step_seconds"] == 0.005
    assert figures["plan_check"]["taken_step_seconds"] == pytest.approx(taken, abs=0.051 / 30)  # 0.1 s printed
    assert figures["plan_check"]["schedule_done_at_notes"] == [0, 0]
    figures.update(best_val_loss=1.0, target_loss=None)
    line = [text for text in report._run_lines({"baby-adamw": figures}) if "time plan" in text]
    assert line and line[0].startswith("baby-adamw: the time plan's step 0.0050 s against")
    assert "plan_check" not in report.run_figures(trained_run.run_dir, target_loss=None)  # no budget


def test_a_done_line_of_thousands_of_steps_is_read_with_its_separators(report, tmp_path):
    # The last line counts steps as every other line does ("done: 2,487 steps"); the parser read \d+ only.
    for total in ("590", "590.3"):  # the total in whole seconds until 2026-12-06, in tenths since
        (tmp_path / "train.log").write_text(
            "step 2487: validation loss 1.4457 (best)\n"
            f"done: 2,487 steps in {total} s (start-up 5.1 s (0.9%), train 560.0 s (94.9%)), 8,924 tok/s, "
            "best validation loss 1.4457; checkpoints in x\n", encoding="utf-8")
        done = report.run_figures(tmp_path, target_loss=None)["done"]
        figures = (done["steps"], done["wall_seconds"], done["tokens_per_second"])
        assert figures == (2487, float(total), 8924.0)
    resumed = [("done: 1 step (step 1001) in 5 s", 1), ("done: 1,345 steps (steps 1001-2345) in 5 s", 1345)]
    for line, steps in resumed:  # a resumed session's line names its steps; one step is "1 step"
        (tmp_path / "train.log").write_text(f"{line} (train 4.0 s (80.0%)), 8,924 tok/s, best validation "
                                            "loss 1.4457; checkpoints in x\n", encoding="utf-8")
        assert report.run_figures(tmp_path, target_loss=None)["done"]["steps"] == steps, line
    # a session of the one step that compiled the model timed none (Logger.finish)
    (tmp_path / "train.log").write_text("done: 1 step (step 1001) in 30 s (compile 20.0 s (66.7%)), no tok/s "
                                        "(its one step compiled the model), best validation loss 1.4457; "
                                        "checkpoints in x\n", encoding="utf-8")
    done = report.run_figures(tmp_path, target_loss=None)["done"]
    assert (done["steps"], done["tokens_per_second"], done["split_seconds"]) == (1, None, {"compile": 20.0})


def test_a_plans_step_is_set_beside_the_train_seconds_of_the_steps_not_compiling(report):
    # A resumed budget session's first step compiles the model (timed as "compile"): "train" is the others'.
    done = {"steps": 11, "split_seconds": {"compile": 20.0, "train": 5.0}}
    assert report._plan_check([("60", "40", "0.5", "50")], done)["taken_step_seconds"] == 0.5
