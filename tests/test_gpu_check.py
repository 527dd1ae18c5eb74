"""benchmarks/gpu_check.sh's helpers read what a run writes, and a summary survives missing pieces.

The GPU check runs once, on a lent machine, far from this suite: these keep the parsing it
relies on (train.log's lines, TensorBoard's tags) in step with what training writes.
"""

import importlib.util
import json
import subprocess
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
    figures = report.run_figures(trained_run.run_dir, target_loss=100.0)
    assert figures["validation"] == [[30, pytest.approx(trained_run.last_val_loss, abs=1e-4)]]
    assert figures["done"]["steps"] == 30 and figures["done"]["wall_seconds"] >= 0
    assert {"start-up", "train", "eval", "save"} <= set(figures["done"]["split_seconds"])
    assert figures["done"]["best_val_loss"] == pytest.approx(trained_run.best_val_loss, abs=1e-4)
    assert figures["target_reached_at_step"] == 30
    tensorboard = figures["tensorboard"]
    assert [row[0] for row in tensorboard["val_loss"]] == [30] and tensorboard["seconds_to_target"] >= 0


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


def test_the_script_parses():
    subprocess.run(["bash", "-n", str(ROOT / "benchmarks" / "gpu_check.sh")], check=True)
