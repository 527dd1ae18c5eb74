"""Behaviour of the batch sampler and of resuming that a mutation sweep of data/batches.py and
train/resume.py found no test pinning."""

from pathlib import Path

import numpy as np

from tinyattn.config import load_config
from tinyattn.data.batches import BatchSampler
from tinyattn.train.resume import ResumePoint, same_source

TINY = Path(__file__).resolve().parent.parent / "configs" / "tiny.yaml"


def counting_tokens(n=1000):
    return np.arange(n, dtype=np.uint16)  # token i at position i: a window shows where it came from


def test_random_sampling_takes_a_text_too_short_for_a_pass():
    T = 8
    sampler = BatchSampler(counting_tokens(T + 1), 2, T, seed=0, sampling="random")
    x, y = sampler.next_batch()
    assert x[0].tolist() == list(range(T)) and y[0].tolist() == list(range(1, T + 1))


def test_two_missing_paths_through_a_link_are_not_one_init_from_source(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "models")
    assert same_source(str(tmp_path / "link" / "tiny"), str(tmp_path / "link" / "tiny"))
    assert not same_source(str(tmp_path / "link" / "tiny"), str(tmp_path / "models" / "tiny"))
    (tmp_path / "models" / "tiny").mkdir()  # once it exists, both spellings name it
    assert same_source(str(tmp_path / "link" / "tiny"), str(tmp_path / "models" / "tiny"))


def test_windows_and_pass_orders_are_the_ones_each_rank_and_batch_drew_before():
    # Golden starts: a run saved by this tinyattn resumes on the draws it would have made.
    def starts(rank, sampling="random"):
        sampler = BatchSampler(counting_tokens(), 3, 8, seed=5, rank=rank, world_size=2, sampling=sampling)
        return [sampler.next_batch()[0][:, 0].tolist() for _ in range(2)]

    assert starts(0) == [[665, 798, 22], [882, 736, 566]]
    assert starts(1) == [[131, 768, 772], [880, 875, 271]]
    assert starts(1, "passes") == [[990, 478, 798], [38, 510, 726]]  # pass 0's order, from (seed, 2, 0)


def test_a_state_saved_before_windows_were_counted_counts_them_at_its_own_world_size():
    sampler = BatchSampler(counting_tokens(), 4, 8, seed=3, world_size=1, sampling="passes")
    sampler.load_state_dict({"seed": 3, "batches_drawn": 5, "rank": 0, "world_size": 2, "batch_size": 4})
    assert sampler.windows_drawn == 5 * 2 * 4


def test_a_fork_may_name_another_out_dir(tmp_path):
    # the refusal of another train.out_dir in place advises this very fork
    (tmp_path / "runs" / "orig").mkdir(parents=True)
    point = ResumePoint(tmp_path / "runs" / "orig" / "step_0000010.pt", {}, load_config(TINY), 10)
    config = load_config(TINY, [f"train.out_dir={tmp_path / 'elsewhere'}"])
    point.keep_out_dir(config, "fork", given=["train.out_dir"])


def test_a_state_after_a_batch_size_change_keeps_its_counted_windows():
    first = BatchSampler(counting_tokens(), 4, 8, seed=3, sampling="passes")
    for _ in range(3):
        first.next_batch()
    second = BatchSampler(counting_tokens(), 6, 8, seed=3, sampling="passes")  # resumed at another size
    second.load_state_dict(first.state_dict())
    second.next_batch()
    third = BatchSampler(counting_tokens(), 6, 8, seed=3, sampling="passes")
    third.load_state_dict(second.state_dict())  # 4 batches at size 6 would be 24 windows
    assert third.windows_drawn == 3 * 4 + 6
    assert third.next_batch()[0].tolist() == second.next_batch()[0].tolist()


def test_a_state_saved_before_passes_at_its_start_draws_the_first_pass():
    # saved before the state held windows_drawn or pass_starts
    old = {"seed": 3, "batches_drawn": 0, "rank": 0, "world_size": 1, "batch_size": 4}
    resumed = BatchSampler(counting_tokens(), 4, 8, seed=3, sampling="passes")
    resumed.load_state_dict(old)
    fresh = BatchSampler(counting_tokens(), 4, 8, seed=3, sampling="passes")
    assert resumed.next_batch()[0].tolist() == fresh.next_batch()[0].tolist()


def test_a_state_saved_before_passes_resumes_random_sampling_of_a_text_too_short_for_a_pass():
    # such a text holds no whole pass (0 windows a pass): the resume was refused, "range() arg 3 must
    # not be zero", for a run that never drew passes
    T = 8
    old = {"seed": 3, "batches_drawn": 5, "rank": 0, "world_size": 1, "batch_size": 2}
    resumed = BatchSampler(counting_tokens(T + 3), 2, T, seed=3, sampling="random")
    resumed.load_state_dict(old)
    fresh = BatchSampler(counting_tokens(T + 3), 2, T, seed=3, sampling="random")
    for _ in range(5):
        fresh.next_batch()
    assert resumed.next_batch()[0].tolist() == fresh.next_batch()[0].tolist()


def test_a_dropout_given_for_a_resume_of_a_run_with_a_dropout_table_is_taken(tmp_path):
    table = ["train.dropout_by_passes={6: 0.075, 10: 0.1}"]
    run = load_config(TINY, [*table, "model.dropout=0.1"])  # the dropout its start chose
    point = ResumePoint(tmp_path / "step_0000010.pt", {}, run, 10)
    config = load_config(TINY, [*table, "model.dropout=0.0"])
    point.adopt(config, given=["model.dropout"])
    assert config.model.dropout == 0.0
    point.adopt(config := load_config(TINY, [*table, "model.dropout=0.0"]))  # not given: the run's
    assert config.model.dropout == 0.1


def test_a_step_count_given_for_a_resume_is_taken_and_not_called_the_configs(tmp_path):
    point = ResumePoint(tmp_path / "step_0000010.pt", {}, load_config(TINY, ["train.max_steps=20"]), 10)
    config = load_config(TINY, ["train.max_steps=50"])
    point.adopt(config, given=["train.max_steps", "train.time_budget"])  # a budget turned off by --set too
    assert config.train.max_steps == 50
    assert not [note for note in point.notes if "train.max_steps" in note]
