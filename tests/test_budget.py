"""The time budget: a run ends within its budget and uses it, whatever the machine's speed does.

Every run here trains under a fake clock that a step, an evaluation or the start-up advance
by the seconds a test gives, so a machine that slows down halfway is a line of code and no
assertion reads the wall clock. The seconds are binary fractions (0.25, 0.375, ...): their
sums are exact, so two runs that see the same readings make bit-for-bit the same decisions.
"""

import math
import os
import re
import signal
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import local_corpus
from tinyattn import checkpoint as ckpt
from tinyattn.config import load_config
from tinyattn.errors import TinyattnError
from tinyattn.train import budget
from tinyattn.train.budget import TimePlan
from tinyattn.train.passes import PassChoices, PassTables, entry_for, shown_passes
from tinyattn.train.loop import train
from tinyattn.train.optim import lr_factor, progress_lr_factor
from tinyattn.train.owners import EvalResult, Evaluator
from tinyattn.train.resume import ResumePoint
from tinyattn.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.yaml"

# The runs trained here in process write to the page cache alone (conftest.no_fsync says why).
pytestmark = pytest.mark.usefixtures("no_fsync")


@pytest.fixture(scope="module")
def corpus(shakespeare_head, tmp_path_factory) -> Path:
    """The real text in a folder of the module's own, beside the token cache its runs share: each run
    reads the text tokenized once, as a run that reuses its data cache does (no test here is of the
    cache)."""
    folder = tmp_path_factory.mktemp("budget_corpus")
    (folder / "corpus.txt").write_bytes(shakespeare_head.read_bytes())
    return folder / "corpus.txt"


def corpus_items(corpus: Path, out_dir: Path) -> list[str]:
    """local_corpus's --set items for runs in out_dir, with the module's token cache beside `corpus`."""
    return [*local_corpus(corpus, out_dir), f"data.cache_dir={corpus.parent / 'cache'}"]


def budget_config(corpus: Path, out_dir: Path, budget: str, *extra: str):
    return load_config(TINY, [*corpus_items(corpus, out_dir), f"train.time_budget={budget}", "train.show=[]",
                              "train.eval_interval=25", "train.warmup_steps=4", *extra])


class FakeClock:
    """The run's clock: it moves only when the fake machine says an operation took time."""

    def __init__(self, now: float = 0.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


class FakeMachine:
    """Patches Trainer.train_step and Evaluator.run to advance `clock`; records each step's rate.

    step_seconds(now, step): what step `step` (0-based), started at fake time `now`, takes. A resumed
    run is a new process whose clock starts again at 0: its steps are told apart by number.
    compute=False: a step
    only counts (no forward or backward) and an evaluation gives a constant loss, for runs of
    hundreds of steps.
    """

    def __init__(self, monkeypatch, clock: FakeClock, step_seconds, *, eval_seconds: float = 0.5,
                 compute: bool = True, signal_at_step=None):
        self.clock, self.step_seconds, self.signal_at_step = clock, step_seconds, signal_at_step
        self.rates: dict[int, float] = {}  # step (0-based) -> its learning-rate factor (the last run's)
        self.calls = 0  # train_step calls, the calibration's throwaway steps included
        real_step, real_eval = Trainer.train_step, Evaluator.run
        machine = self

        def train_step(trainer):
            machine.calls += 1
            machine.rates[trainer.step] = trainer.plan.factor(trainer.step)
            seconds = machine.step_seconds(clock.now, trainer.step)
            if compute:
                out = real_step(trainer)
            else:
                trainer.step += 1
                trainer.tokens_seen += trainer.tokens_per_step
                out = torch.tensor(2.0), torch.tensor(0.5)
            clock.now += seconds
            if trainer.step == machine.signal_at_step:
                os.kill(os.getpid(), signal.SIGTERM)  # as `kill` would: the loop saves and stops
            return out

        def run(evaluator, step):
            clock.now += eval_seconds
            if compute:
                return real_eval(evaluator, step)
            return EvalResult(step, np.full(evaluator.config.model.context_length, 3.0))

        monkeypatch.setattr(Trainer, "train_step", train_step)
        monkeypatch.setattr(Evaluator, "run", run)


def factors_after_warmup(rates: dict, warmup: int) -> list[float]:
    return [rates[s] for s in sorted(rates) if s >= warmup]


@pytest.mark.parametrize("before, after", [(0.25, 0.325), (0.325, 0.25)], ids=["slows-30%", "speeds-up-30%"])
def test_a_run_ends_within_its_budget_and_uses_it_when_the_machine_changes_speed_halfway(
        corpus, tmp_path, monkeypatch, before, after):
    """Planned once at the start, the slowed run would end at 115 s of 100, the faster one at 89."""
    clock = FakeClock()
    machine = FakeMachine(monkeypatch, clock, lambda now, step: before if now < 50 else after, compute=False)
    result = train(budget_config(corpus, tmp_path, "100s", "train.log_interval=50"), run_name="speed",
                   progress=False, clock=clock)
    assert not result.interrupted
    assert 95.0 <= result.wall_seconds <= 100.0 - TimePlan.EXIT_SECONDS, result.wall_seconds
    # The schedule reached its end, and the re-planning moved it smoothly: no step changes the
    # rate by more than twice what a cosine of the same length changes it at its steepest.
    factors = factors_after_warmup(machine.rates, 4)
    floor = 2.0e-4 / 2.0e-3
    assert factors[-1] < floor + 1e-3
    steepest = (1 - floor) * math.pi / 2 / len(factors)
    assert max(abs(a - b) for a, b in zip(factors, factors[1:])) < 2 * steepest
    state = ckpt.load_checkpoint(ckpt.latest_checkpoint(result.run_dir))
    assert state["step"] == result.step and state["plan"]["progress"] == 1.0 and state["plan"]["finished"]


@pytest.mark.slow  # three runs of about fifty real steps
def test_an_interrupted_and_resumed_budget_run_equals_an_uninterrupted_one(corpus, tmp_path, monkeypatch):
    """Same steps, same rates, same plan, the same weights; SIGTERM still saves and ends the run.

    The budget fits the stop, the slowing down after it and an evaluation after both."""
    extra = ("model.dropout=0.1",)

    def step_seconds(now, step):
        return 0.25 if step < 40 else 0.375  # the machine slows after the resume point

    clock = FakeClock()
    machine = FakeMachine(monkeypatch, clock, step_seconds)
    straight = train(budget_config(corpus, tmp_path, "20s", *extra), run_name="straight", progress=False,
                     clock=clock)
    straight_rates = dict(machine.rates)

    clock.now = 0.0
    machine.signal_at_step = 37  # not an evaluation step: the stop's own checkpoint
    first = train(budget_config(corpus, tmp_path, "20s", *extra), run_name="split", progress=False,
                  clock=clock)
    assert first.interrupted and first.step == 37
    saved = ckpt.load_checkpoint(ckpt.latest_checkpoint(first.run_dir))
    assert saved["step"] == 37 and saved["plan"]["kind"] == "time" and 0 < saved["plan"]["progress"] < 1
    machine.signal_at_step, clock.now = None, 0.0  # a new process, its start-up taking no time
    resumed = train(budget_config(corpus, tmp_path, "20s", *extra), run_name="split", resume=True,
                    progress=False, clock=clock)

    assert resumed.step == straight.step > 50  # past the slowing down and the evaluation after it
    assert machine.rates == straight_rates  # every step's rate, the resumed ones and those before
    a = ckpt.load_checkpoint(ckpt.latest_checkpoint(straight.run_dir))
    b = ckpt.load_checkpoint(ckpt.latest_checkpoint(resumed.run_dir))
    assert a["plan"] == b["plan"]  # progress, seconds spent, measurements and the re-plan history
    for name, tensor in a["model"].items():  # CPU thread order: within 1e-6, not bitwise
        torch.testing.assert_close(tensor, b["model"][name], rtol=0, atol=1e-6, msg=name)
    assert resumed.best_val_loss == pytest.approx(straight.best_val_loss, abs=1e-6)


def test_a_resumed_budget_run_counts_the_time_already_spent(corpus, tmp_path, monkeypatch):
    """A resume whose start-up took 10 s ends within the budget over both sessions, not 10 s late;
    it continues the recorded plan, measuring nothing again."""
    clock = FakeClock()
    machine = FakeMachine(monkeypatch, clock, lambda now, step: 0.25, compute=False, signal_at_step=100)
    first = train(budget_config(corpus, tmp_path, "100s"), run_name="run", progress=False, clock=clock)
    spent_first = ckpt.load_checkpoint(ckpt.latest_checkpoint(first.run_dir))["plan"]["spent"]
    machine.signal_at_step, clock.now, machine.calls = None, 0.0, 0
    resumed = train(budget_config(corpus, tmp_path, "100s"), run_name="run", resume=True, progress=False,
                    clock=clock, elapsed_before=10.0)
    assert machine.calls == resumed.step - 100  # no measuring steps: only the steps left
    total = spent_first + resumed.wall_seconds
    assert 95.0 <= total <= 100.0 - TimePlan.EXIT_SECONDS, total
    state = ckpt.load_checkpoint(ckpt.latest_checkpoint(resumed.run_dir))
    assert state["plan"]["spent"] == pytest.approx(total) and state["plan"]["finished"]
    # Its plan's schedule ends at the floor, as today's: no note of an older one.
    log = (resumed.run_dir / "train.log").read_text()
    assert "was saved before 2026-12-05" not in log
    # Its first line names the plan it continues, its last the seconds spent over both sessions.
    announced = next(line for line in log.splitlines() if "(resuming from" in line)
    assert re.search(r", the 100s budget's plan, \d+ s of it spent$", announced), announced
    assert f"; {total:.0f} s of the 100s budget spent" in log.splitlines()[-1], log.splitlines()[-1]


def test_a_new_budget_run_counts_its_start_up_once(corpus, tmp_path, monkeypatch):
    """10 s of start-up before the first measurement: the run ends within the budget and uses it, its
    plan counting those seconds once (the measuring, put back after, must not put back the plan's clock)."""
    clock = FakeClock()
    FakeMachine(monkeypatch, clock, lambda now, step: 0.25, compute=False)
    result = train(budget_config(corpus, tmp_path, "100s"), run_name="run", progress=False, clock=clock,
                   elapsed_before=10.0)
    assert 95.0 <= result.wall_seconds <= 100.0 - TimePlan.EXIT_SECONDS, result.wall_seconds
    state = ckpt.load_checkpoint(ckpt.latest_checkpoint(result.run_dir))
    assert state["plan"]["spent"] == pytest.approx(result.wall_seconds) and state["plan"]["finished"]
    # The plan at each evaluation (every 25 steps and the last) is in the checkpoint.
    history = state["plan"]["history"]
    assert [entry[0] for entry in history] == sorted({*range(25, result.step, 25), result.step})
    assert history[-1][1] == pytest.approx(result.wall_seconds) and tuple(history[-1][3:]) == (0, 1.0)


def test_the_measuring_line_splits_the_start_up_from_the_measuring_as_the_last_line_does(
        corpus, tmp_path, monkeypatch):
    """The calibration's line called start-up and measuring together "s of start-up" (13 s here, 65 s
    for a first compile), where the run's last line splits them: start-up 10.0 s, calibration 3.4 s."""
    clock = FakeClock()
    FakeMachine(monkeypatch, clock, lambda now, step: 0.25, compute=False)
    result = train(budget_config(corpus, tmp_path, "100s"), run_name="run", progress=False, clock=clock,
                   elapsed_before=10.0)
    log = (result.run_dir / "train.log").read_text(encoding="utf-8")
    line = next(line for line in log.splitlines() if "s per checkpoint" in line)
    last = next(line for line in log.splitlines() if "done: " in line)
    start_up, calibration = (float(value) for value in
                             re.search(r"start-up ([\d.]+) s .*calibration ([\d.]+) s", last).groups())
    assert start_up == pytest.approx(10.0, abs=0.05) and calibration > 1.0
    assert f"per checkpoint, {start_up:.0f} s of start-up and {calibration:.0f} s measuring -> about " in line


def test_a_finished_budget_run_resumed_says_how_to_train_on_and_that_way_works(corpus, tmp_path, monkeypatch):
    clock = FakeClock()
    FakeMachine(monkeypatch, clock, lambda now, step: 0.25, compute=False)
    first = train(budget_config(corpus, tmp_path, "100s"), run_name="run", progress=False, clock=clock)
    clock.now = 0.0
    # a longer budget given (200s) reopens nothing, and the message says so (it named only max_steps)
    with pytest.raises(TinyattnError, match=rf"the run ended at step {first.step}: its time budget planned no "
                                            rf"further step \(a longer train\.time_budget does not reopen a "
                                            rf"run that ended\); --set train\.max_steps=N with N above "
                                            rf"{first.step} trains on"):
        train(budget_config(corpus, tmp_path, "200s"), run_name="run", resume=True, progress=False, clock=clock)
    more = budget_config(corpus, tmp_path, "100s")  # what the message says: the budget is then off
    more.train.time_budget, more.train.max_steps = None, first.step + 5
    clock.now = 0.0
    assert train(more, run_name="run", resume=True, progress=False, clock=clock).step == first.step + 5


def test_a_budget_run_resumed_without_its_budget_says_it_trains_a_step_count_and_an_edited_count_turns_it_off(
        corpus, tmp_path, monkeypatch, capsys):
    # A --config file without a budget (a Config without one) ended the run's time plan without a word;
    # max_steps edited in config.yaml was said to apply and then replaced by the plan's first estimate.
    from tinyattn.cli.train import main as train_main

    clock = FakeClock()
    FakeMachine(monkeypatch, clock, lambda now, step: 0.25, compute=False, signal_at_step=100)
    run = train(budget_config(corpus, tmp_path, "100s"), run_name="run", progress=False, clock=clock).run_dir
    estimate = load_config(run / "config.yaml").train.max_steps
    config_yaml = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text(config_yaml.replace(f"max_steps: {estimate}", "max_steps: 102"))
    capsys.readouterr()
    assert train_main(["--resume", str(run), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert f"train.max_steps=102 edited in {run / 'config.yaml'}: the time budget 100s is off for this run" in err
    assert "done: 2 steps (steps 101-102)" in err
    saved = load_config(run / "config.yaml").train
    assert (saved.time_budget, saved.max_steps) == (None, 102)
    other = tmp_path / "other"
    other.mkdir()
    monkeypatch.setattr(TimePlan, "load_state_dict", None)  # a step count reads no time plan
    no_budget = budget_config(corpus, other, "100s", "train.time_budget=null", "train.max_steps=104")
    result = train(no_budget, resume=run / "step_0000102.pt", run_name="fork", progress=False)
    assert result.step == 104
    note = (f"note: the run {run} trained under a time budget of 100s, which the config does not have: it "
            "trains a step count from here on (train.max_steps 104; the budget's plan and its rates end); "
            "--set train.time_budget=100s continues the plan")
    assert note not in capsys.readouterr().err  # a step run's checkpoint (102) no longer records the budget
    fork = train(no_budget, resume=run / "step_0000100.pt", run_name="fork100", progress=False)
    assert fork.step == 104 and note in capsys.readouterr().err


def test_a_resume_whose_budget_is_spent_by_its_start_up_is_refused_and_a_one_step_session_says_1_step(
        corpus, tmp_path, monkeypatch, capsys):
    """A run stopped near the end of its budget, resumed with a start-up that spends the rest: no
    step fits, as for a finished run (it trained one step past the budget, "done: 1 steps")."""
    clock = FakeClock()
    machine = FakeMachine(monkeypatch, clock, lambda now, step: 0.25, compute=False, signal_at_step=100)
    first = train(budget_config(corpus, tmp_path, "100s"), run_name="run", progress=False, clock=clock)
    spent = ckpt.load_checkpoint(ckpt.latest_checkpoint(first.run_dir))["plan"]["spent"]
    files = {p.name: p.read_bytes() for p in first.run_dir.iterdir() if p.name != "train.log"}
    machine.signal_at_step, clock.now = None, 0.0
    with pytest.raises(TinyattnError, match=rf"^{re.escape(str(first.run_dir))}: the run is at step 100, and its "
                                            r"time budget 100s is spent \(100 s over its sessions, this one's start-up included\): no step fits; "
                                            r"--set train\.max_steps=N with N above 100 trains on"):
        train(budget_config(corpus, tmp_path, "100s"), run_name="run", resume=True, progress=False, clock=clock,
              elapsed_before=100.0 - spent)
    assert {p.name: p.read_bytes() for p in first.run_dir.iterdir() if p.name != "train.log"} == files
    more = budget_config(corpus, tmp_path, "100s")  # what the message says: the budget is then off
    more.train.time_budget, more.train.max_steps = None, 101
    capsys.readouterr()
    assert train(more, run_name="run", resume=True, progress=False, clock=clock).step == 101
    assert "done: 1 step (step 101) in " in capsys.readouterr().err


def test_a_run_whose_checkpoint_writes_are_slow_keeps_time_for_the_last_evaluations_two(
        corpus, tmp_path, monkeypatch):
    """The last evaluation writes its step checkpoint and, being the best so far, best.pt: the one
    write the calibration times counts twice, so 4 s writes still end the run within its budget."""
    clock = FakeClock()
    FakeMachine(monkeypatch, clock, lambda now, step: 0.25, compute=False)
    real_save = ckpt.save_checkpoint

    def slow_save(state, path):
        real_save(state, path)
        clock.now += 4.0

    monkeypatch.setattr(ckpt, "save_checkpoint", slow_save)
    result = train(budget_config(corpus, tmp_path, "60s", "train.eval_interval=100000"),
                   run_name="slow-writes", progress=False, clock=clock)
    assert sorted(p.name for p in result.run_dir.glob("*.pt")) == ["best.pt", ckpt.step_filename(result.step)]
    assert 55.0 <= result.wall_seconds <= 60.0 - TimePlan.EXIT_SECONDS, result.wall_seconds


def test_a_run_saved_before_time_plans_resumed_with_config_continues_to_the_step_count_it_chose():
    """A checkpoint saved before time plans records no plan: its run fixed a step count at its start
    (its config records it), and a resume with --config FILE (which says 20) goes on to that count."""
    from tinyattn.system.distributed import Distributed
    from tinyattn.train.optim import StepPlan

    saved = load_config(TINY, ["train.time_budget=10m", "train.max_steps=777"])
    point = ResumePoint(Path("run") / ckpt.step_filename(100), {"step": 100}, saved, 100)
    config = load_config(TINY, ["train.time_budget=10m"])
    point.adopt(config)
    plan = budget.plan_for(config.train, point.state, FakeClock(), dist=Distributed(),
                           device=torch.device("cpu"))
    assert isinstance(plan, StepPlan) and config.train.max_steps == 777
    assert not plan.done(776) and plan.done(777)


def test_a_run_that_trained_a_step_count_resumed_with_a_budget_keeps_its_step_schedule():
    """Its checkpoint's plan is a step count's: the resume goes on with StepPlan, not a time plan."""
    from tinyattn.system.distributed import Distributed
    from tinyattn.train.optim import StepPlan

    config = load_config(TINY, ["train.time_budget=10m", "train.max_steps=777"]).train
    state = {"step": 100, "plan": StepPlan(config).state_dict()}
    plan = budget.plan_for(config, state, FakeClock(), dist=Distributed(), device=torch.device("cpu"))
    assert isinstance(plan, StepPlan) and plan.done(777) and not plan.done(776)
    new_run = budget.plan_for(config, None, FakeClock(), dist=Distributed(), device=torch.device("cpu"))
    assert isinstance(new_run, TimePlan)


def test_a_budget_given_as_a_bare_number_of_seconds_is_shown_with_its_unit():
    # train.time_budget: 10 printed "fit the 10 budget", "time budget 10: ...": 10 what?
    from tinyattn.config import duration_text

    config = load_config(TINY, ["train.time_budget=10"]).train
    assert TimePlan(config.time_budget, config, FakeClock()).text == "10s"
    assert [duration_text(t) for t in ("10", " 2.5 ", "90s", "10m", "1.5h", "3min")] == [
        "10s", "2.5s", "90s", "10m", "1.5h", "3min"]


def test_a_resumed_plan_with_time_for_exactly_one_more_step_takes_it():
    config = load_config(TINY, ["train.eval_interval=100000"]).train
    saved = TimePlan("100s", config, FakeClock())
    saved.seed(1.0, 0.0, 0.0)
    clock = FakeClock(100 * (1 - TimePlan.MARGIN) - TimePlan.EXIT_SECONDS - 1.5)  # 1.5 s left: one 1 s step
    resumed = TimePlan("100s", config, clock)
    resumed.load_state_dict(saved.state_dict())
    assert resumed.steps_that_fit(100) == 1 and not resumed.no_step_fits(100)
    clock.now += 1.0
    assert resumed.no_step_fits(100)


def test_a_resumed_plan_whose_start_up_left_time_for_one_step_trains_it_at_the_floor():
    config = load_config(TINY, ["train.eval_interval=100000", "train.warmup_steps=10"]).train
    saved = TimePlan("100s", config, FakeClock())
    saved.seed(1.0, 0.0, 0.0)
    saved.progress = 0.5  # the checkpoint's: half the schedule done, many steps counted as left
    assert saved.steps_left > 50
    clock = FakeClock(100 * (1 - TimePlan.MARGIN) - TimePlan.EXIT_SECONDS - 1.5)  # start-up spent the rest
    resumed = TimePlan("100s", config, clock)
    resumed.load_state_dict(saved.state_dict())
    assert not resumed.no_step_fits(100)
    assert resumed.total_steps(100) == 101
    assert resumed.factor(100) == pytest.approx(config.min_lr / config.lr)  # the last step, at the floor


def _step_plan(plan, clock, step, rates, stop_at=None):
    """Steps `plan` as the loop does (0.25 s a step, 0.375 s from step 30, 0.5 s an evaluation), keeping
    each step's rate in `rates`; returns the step it stopped at and the plan's state there."""
    plan.start()
    while not plan.done(step):
        rates[step] = plan.factor(step)
        clock.now += 0.25 if step < 30 else 0.375
        step += 1
        plan.after_step(step)
        if step % plan.config.eval_interval == 0 or plan.done(step):
            with plan.measuring("eval"):
                clock.now += 0.5
        if step == stop_at:
            return step, plan.state_dict()
    return step, None


def test_a_distributed_plan_resumed_with_no_start_up_makes_the_decisions_of_a_run_that_never_stopped():
    """Rank 0 of a distributed run counts the steps that fit every log_interval steps and counts down
    between. A resume whose start-up took no time (the same clock readings) counted again instead of
    going on with the checkpoint's count: the rate of every step after it differed."""
    config = load_config(TINY, ["train.eval_interval=20", "train.warmup_steps=4"]).train

    def new_plan(clock):
        plan = TimePlan("30s", config, clock, replan_every=10)
        plan.seed(0.25, 0.5, 0.0)
        return plan

    straight, split = {}, {}
    clock = FakeClock()
    _step_plan(new_plan(clock), clock, 0, straight)
    clock = FakeClock()
    step, state = _step_plan(new_plan(clock), clock, 0, split, stop_at=37)
    clock = FakeClock()  # a new process, its start-up taking no time
    resumed = TimePlan("30s", config, clock, replan_every=10)
    resumed.load_state_dict(state)
    assert not resumed.no_step_fits(step)
    _step_plan(resumed, clock, step, split)
    assert len(split) == len(straight) > 40
    assert [s for s in straight if split[s] != straight[s]] == []


def test_a_budget_run_saved_before_time_plans_resumes_through_train_to_the_step_count_it_chose(
        corpus, tmp_path, monkeypatch):
    """The same through `train`: config.yaml and the checkpoint hold the count the budget's start
    chose (its first estimate, as the run said it), and the resume trains on to it, step by step."""
    clock = FakeClock()
    machine = FakeMachine(monkeypatch, clock, lambda now, step: 0.25, compute=False, signal_at_step=50)
    first = train(budget_config(corpus, tmp_path, "100s"), run_name="run", progress=False, clock=clock)
    chosen = load_config(first.run_dir / "config.yaml").train.max_steps
    log = (first.run_dir / "train.log").read_text()
    assert f"-> about {chosen} steps; the schedule follows the time left" in log
    latest = ckpt.latest_checkpoint(first.run_dir)
    state = ckpt.load_checkpoint(latest)
    del state["plan"]  # as a checkpoint saved before time plans
    ckpt.save_checkpoint(state, latest)
    machine.signal_at_step, clock.now, machine.calls = None, 0.0, 0
    resumed = train(budget_config(corpus, tmp_path, "100s"), run_name="run", resume=True, progress=False,
                    clock=clock)
    assert resumed.step == chosen and machine.calls == chosen - 50


def test_entry_for_takes_the_entry_with_the_most_passes_at_or_below_the_count():
    table = {3.0: 0.1, 8.0: 0.2}
    assert [entry_for(table, passes) for passes in (0.5, 2.99, 3.0, 7.9, 8.0, 40.0)] == \
        [None, None, 0.1, 0.1, 0.2, 0.2]
    assert entry_for({}, 100.0) is None


def test_a_run_of_fixed_steps_whose_table_entries_equal_its_values_chooses_nothing():
    """100 steps of 128 tokens over 12,800: one pass. Entries equal to the model's dropout, the floor
    and the decay it has leave them as they are (None: config.yaml then pins no attention dropout);
    other entries are chosen."""
    from types import SimpleNamespace

    from tinyattn.config import TrainConfig
    from tinyattn.train.passes import PassTables, choose_by_steps

    config = TrainConfig(lr=1e-3, min_lr=5e-4, weight_decay=0.25, max_steps=100)
    trainer = SimpleNamespace(config=config, tokens_per_step=128,
                              batches=SimpleNamespace(tokens=np.zeros(12_800)),
                              model=SimpleNamespace(dropout=torch.nn.Dropout(0.125)))
    same = PassTables(config, dropout_by_passes={1.0: 0.125}, floor_by_passes={1.0: 0.5},
                      decay_by_passes={1.0: 0.25})
    choices = choose_by_steps(trainer, same)
    assert (choices.passes, choices.dropout, choices.min_lr, choices.weight_decay) == (1.0, None, None, None)
    other = PassTables(config, dropout_by_passes={1.0: 0.25}, floor_by_passes={1.0: 0.25},
                       decay_by_passes={1.0: 0.5})
    choices = choose_by_steps(trainer, other)
    assert (choices.dropout, choices.min_lr, choices.weight_decay) == (0.25, 2.5e-4, 0.5)


@pytest.mark.parametrize("idle_step, passes, chosen", [(0.5, "0.4 passes over the training text fit", 0.0),
                                                       (0.125, "1.8 passes over the training text fit, "
                                                               "1.2 with model.dropout=0.1", 0.1),
                                                       (0.03125, "7.3 passes over the training text fit, "
                                                                 "4.8 with model.dropout=0.2", 0.2)],
                         ids=["slow", "fast", "fastest"])
def test_the_budget_gives_a_faster_machine_more_dropout_and_a_resume_keeps_it(
        corpus, tmp_path, monkeypatch, idle_step, passes, chosen):
    """Under one budget a faster machine fits more passes over the text, and gets the dropout the
    config's table names for the passes it makes with it: the model is measured again with it
    (each dropped-out step is slower here), config.yaml records it and a resumed run builds the
    same model."""
    seen, weights_seen = [], []  # each step's dropout: the residual's, the attention weights'

    def step_seconds(now, step):  # the fake machine: dropout makes a step 1.5 times as slow
        return idle_step * (1.5 if seen[-1] > 0 else 1.0)

    clock = FakeClock()
    FakeMachine(monkeypatch, clock, step_seconds, compute=False, signal_at_step=100)
    timed_step = Trainer.train_step

    def recorded_step(trainer):
        seen.append(trainer.model.blocks[1].dropout.p)
        weights_seen.append(trainer.model.blocks[1].attention.dropout)
        return timed_step(trainer)

    monkeypatch.setattr(Trainer, "train_step", recorded_step)
    # attention_dropout null: the attention weights' dropout is model.dropout's (0 at the start;
    # the choice leaves it as the attention path was chosen for, and config.yaml records that)
    table = ("train.dropout_by_passes={0.5: 0.1, 3: 0.2}", "model.attention_dropout=null")
    first = train(budget_config(corpus, tmp_path, "100s", *table, "train.log_interval=50"), run_name="run",
                  progress=False, clock=clock)
    log = (first.run_dir / "train.log").read_text()
    # 0.985 * 100 s less 1 s of exit and 4 s measuring, / step time, * 128 tokens / 54,000
    if chosen:
        assert f"about {passes} -> model.dropout={chosen:g} (train.dropout_by_passes)" in log
    else:  # below the table's first entry: the run says so
        assert f"about {passes} -> model.dropout=0 kept (train.dropout_by_passes starts at 0.5)" in log
    expected_step = idle_step * (1.5 if chosen else 1.0)
    assert f"measured {expected_step:.3f} s/step" in log  # the chosen model's step, measured again
    assert seen[-1] == chosen and set(weights_seen) == {0.0} and first.step == 100
    saved = load_config(first.run_dir / "config.yaml")
    assert (saved.model.dropout, saved.model.weights_dropout) == (chosen, 0.0)  # the attention weights: none

    # forked from its step-100 checkpoint with --config: the table, not the choice; the file's
    # attention_dropout (null: model.dropout's) must not give the attention weights the dropout chosen
    clock.now, seen[:], weights_seen[:] = 0.0, [], []
    point = ResumePoint.find(ckpt.latest_checkpoint(first.run_dir), "with_config", tmp_path)
    resumed = train(budget_config(corpus, tmp_path, "100s", *table, "train.log_interval=50"), resume=point,
                    run_name="with_config", progress=False, clock=clock, stop_at_step=120)
    assert resumed.step == 120 and set(seen) == {chosen} and set(weights_seen) == {0.0}

    clock.now, seen[:], weights_seen[:] = 0.0, [], []  # resumed as the run's last line says: --resume RUN_DIR
    point = ResumePoint.find(first.run_dir, None, tmp_path)
    resumed = train(point.edited_config(), resume=point, progress=False, clock=clock, stop_at_step=120)
    assert resumed.step == 120 and set(seen) == {chosen} and set(weights_seen) == {0.0}


@pytest.mark.parametrize("dropouts, chosen, decay, step, choices", [
    ("{1.5: 0.1}", 0.0, 0.25, 0.125,
     "model.dropout=0 kept (the dearer step leaves it short of the 1.5 passes of its entry in "
     "train.dropout_by_passes), train.min_lr=0.0002 kept (train.floor_by_passes from 1.5 passes: with dropout), "
     "train.weight_decay=0.25 (train.decay_by_passes)"),
    ("{1: 0.05, 1.5: 0.1}", 0.05, 0.25, 0.1875,
     "model.dropout=0.05 (train.dropout_by_passes), train.min_lr=0.0002 kept (train.floor_by_passes starts at 1.5), "
     "train.weight_decay=0.25 (train.decay_by_passes)"),
    ("{1.5: 0.1, 3: 0.2}", 0.0, 0.25, 0.125,  # the tables read under the lowest entry above 1.2 passes
     "model.dropout=0 kept (the dearer step leaves it short of the 1.5 passes of its entry in "
     "train.dropout_by_passes), train.min_lr=0.0002 kept (train.floor_by_passes from 1.5 passes: "
     "with dropout), train.weight_decay=0.25 (train.decay_by_passes)"),
    ("{0: 0.0, 1.5: 0.1}", 0.0, 0.25, 0.125,  # the entry 1.2 passes reach is the model's own: as none-left
     "model.dropout=0 kept (the dearer step leaves it short of the 1.5 passes of its entry in "
     "train.dropout_by_passes), train.min_lr=0.0002 kept (train.floor_by_passes from 1.5 passes: "
     "with dropout), train.weight_decay=0.25 (train.decay_by_passes)")],
    ids=["none-left", "a-lower-entry", "two-above", "own-entry-below"])
def test_a_dropout_whose_dearer_step_falls_short_of_its_entry_is_not_taken(
        corpus, tmp_path, monkeypatch, dropouts, chosen, decay, step, choices):
    """1.8 passes fit at the model's own dropout (0) and 1.2 with the table's 0.1 (a dropped-out
    step is 1.5 times as slow): short of the 1.5 passes that chose it. The run takes the entry
    1.2 passes reach, none or a lower one, at the step time it was measured with, and the other
    tables read the passes of the model chosen: their entries from 1.5 passes on are for runs
    with the dropout that was not taken."""
    seen = []
    clock = FakeClock()
    FakeMachine(monkeypatch, clock, lambda now, step: 0.125 * (1.5 if seen[-1] > 0 else 1.0), compute=False)
    timed_step = Trainer.train_step
    monkeypatch.setattr(Trainer, "train_step", lambda trainer: (seen.append(trainer.model.blocks[1].dropout.p),
                                                                timed_step(trainer))[1])
    tables = [f"train.dropout_by_passes={dropouts}", "train.floor_by_passes={1.5: 0.5}",
              "train.decay_by_passes={0.5: 0.25, 1.5: 0.5}"]
    result = train(budget_config(corpus, tmp_path, "100s", *tables), run_name="run", progress=False, clock=clock)
    log = (result.run_dir / "train.log").read_text()
    assert "about 1.8 passes over the training text fit, 1.2 with model.dropout=0.1 -> " + choices in log
    assert f"measured {step:.3f} s/step" in log  # the step of the model chosen
    saved = load_config(result.run_dir / "config.yaml")
    assert (saved.model.dropout, saved.train.min_lr, saved.train.weight_decay) == (chosen, 2e-4, decay)
    assert seen[-1] == chosen


def test_a_model_whose_dropout_is_its_tables_entry_is_measured_once(corpus, tmp_path, monkeypatch):
    """model.dropout=0.1 and 0.1 the entry for the passes that fit: the step measured is the one the
    run takes, so the calibration measures no second time (3 warm steps and 1.5 s of 0.125 s steps,
    once) and the run says what it keeps, with no passes "with model.dropout=0.1"."""
    clock = FakeClock()
    machine = FakeMachine(monkeypatch, clock, lambda now, step: 0.125, compute=False)
    config = budget_config(corpus, tmp_path, "100s", "model.dropout=0.1",
                           "train.dropout_by_passes={0.5: 0.1}")
    result = train(config, run_name="run", progress=False, clock=clock, stop_at_step=5)
    assert machine.calls == 3 + 12 + 5
    assert "about 1.8 passes over the training text fit -> model.dropout=0.1 (train.dropout_by_passes)" in \
        (result.run_dir / "train.log").read_text()


def test_a_dropout_whose_dearer_step_lands_exactly_on_the_models_own_entry_leaves_the_tables_that_entry():
    """2.5 passes fit at the model's own dropout (0.05), exactly 1 with the 0.1 of the entry at 2: the
    run keeps its own, whose entry it reaches at or below, and the other tables read their entries
    under the 2 passes of the entry it fell short of, the one at exactly 1 included."""
    from types import SimpleNamespace

    config = load_config(TINY, ["train.weight_decay=0.125"]).train
    tables = PassTables(config, dropout_by_passes={1: 0.05, 2: 0.1}, decay_by_passes={1: 0.25, 2: 0.5})
    model = SimpleNamespace(dropout=SimpleNamespace(p=0.05))
    model.set_dropout = lambda p: setattr(model.dropout, "p", p)
    trainer = SimpleNamespace(model=model, tokens_per_step=10, batches=SimpleNamespace(tokens=[0] * 100))
    plan = SimpleNamespace(text="100s", seed=lambda step, evaluation, save: {0.125: 25, 0.25: 10}[step])
    calibration = budget.Calibration(plan, FakeClock(), tables)
    calibration._time_steps = lambda trainer: 0.25  # the step with the dropout tried
    measured = calibration._choose(trainer, 0.125)
    assert model.dropout.p == 0.05 and measured.step == 0.125
    assert measured.choices == PassChoices(2.5, None, None, 0.25, tried=(0.1, 1.0), below=2)


def test_the_budget_sets_the_schedules_floor_from_the_passes_and_a_resume_keeps_it(corpus, tmp_path, monkeypatch):
    """train.floor_by_passes: the share for the passes that fit, times train.lr, becomes
    train.min_lr, the floor the time plan's schedule decays to at every step; config.yaml records
    it, and a run resumed from its folder decays to the same floor."""
    clock = FakeClock()
    FakeMachine(monkeypatch, clock, lambda now, step: 0.125, compute=False, signal_at_step=100)
    floors = []  # train.min_lr as the schedule reads it, one per step
    schedule = budget.progress_lr_factor
    monkeypatch.setattr(budget, "progress_lr_factor", lambda step, progress, config: (
        floors.append(config.min_lr), schedule(step, progress, config))[1])
    table = "train.floor_by_passes={0.5: 0.25, 3: 0.5}"  # 1.8 passes fit (the dropout test's "fast"); lr 2e-3
    first = train(budget_config(corpus, tmp_path, "100s", table), run_name="run", progress=False, clock=clock)
    assert "about 1.8 passes over the training text fit -> train.min_lr=0.0005 (train.floor_by_passes)" in \
        (first.run_dir / "train.log").read_text()
    assert load_config(first.run_dir / "config.yaml").train.min_lr == 5e-4  # tiny.yaml's own: 2e-4
    assert first.step == 100 and set(floors[-100:]) == {5e-4}  # before them: the calibration's steps, undone

    # Resumed from its step-100 checkpoint into new folders: as the run's last line says
    # (--resume, no --config: its config.yaml), and with --config (the file's table, floor 2e-4)
    step_100 = ckpt.latest_checkpoint(first.run_dir)
    for name, config in (("from_its_folder", None), ("with_config", budget_config(corpus, tmp_path, "100s", table))):
        clock.now, floors[:] = 0.0, []
        point = ResumePoint.find(step_100, name, tmp_path)
        resumed = train(config or point.edited_config(), resume=point, run_name=name, progress=False, clock=clock)
        assert resumed.step > 100 and set(floors) == {5e-4}, name


def test_the_budget_sets_the_weight_decay_from_the_passes_and_a_resume_keeps_it(corpus, tmp_path, monkeypatch):
    """train.decay_by_passes: the entry for the passes that fit becomes train.weight_decay, which
    the decayed groups (matrices, head) step with from step 1 and the others (embedding, gains)
    never take; config.yaml records it, and a run resumed from its folder, or forked with the
    config's table, steps with the same decay."""
    clock = FakeClock()
    FakeMachine(monkeypatch, clock, lambda now, step: 0.125, compute=False, signal_at_step=100)
    decays = []  # per step: {group name: weight decay} as the optimizer steps with it
    timed_step = Trainer.train_step
    monkeypatch.setattr(Trainer, "train_step", lambda trainer: (decays.append(
        {g["name"]: g["weight_decay"] for o in trainer.optimizers.optimizers for g in o.param_groups}),
        timed_step(trainer))[1])
    table = "train.decay_by_passes={0.5: 0.25, 3: 0.5}"  # 1.8 passes fit; tiny.yaml's own decay: 0.1
    first = train(budget_config(corpus, tmp_path, "100s", table), run_name="run", progress=False, clock=clock)
    assert "about 1.8 passes over the training text fit -> train.weight_decay=0.25 (train.decay_by_passes)" in \
        (first.run_dir / "train.log").read_text()
    assert load_config(first.run_dir / "config.yaml").train.weight_decay == 0.25
    chosen = {"embedding": 0.0, "head": 0.25, "gains": 0.0, "matrices": 0.25}
    assert first.step == 100 and all(d == chosen for d in decays[-100:])  # before: the calibration's, undone

    step_100 = ckpt.latest_checkpoint(first.run_dir)
    for name, config in (("from_its_folder", None), ("with_config", budget_config(corpus, tmp_path, "100s", table))):
        clock.now, decays[:] = 0.0, []
        point = ResumePoint.find(step_100, name, tmp_path)
        resumed = train(config or point.edited_config(), resume=point, run_name=name, progress=False, clock=clock)
        assert resumed.step > 100 and all(d == chosen for d in decays), name
        assert load_config(resumed.run_dir / "config.yaml").train.weight_decay == 0.25, name


FIXED_STEP_TABLES = ["train.dropout_by_passes={0.2: 0.05, 0.5: 0.1}", "train.floor_by_passes={0.5: 0.5}",
                     "train.decay_by_passes={0.2: 0.25, 0.5: 0.5}"]


@pytest.mark.parametrize("steps, accumulate, choices, chosen", [
    (100, 1, "0.24 passes over the training text -> model.dropout=0.05 (train.dropout_by_passes), train.min_lr=0.0002 "
             "kept (train.floor_by_passes starts at 0.5), train.weight_decay=0.25 (train.decay_by_passes)",
     (0.05, 2e-4, 0.25)),
    (300, 1, "0.71 passes over the training text -> model.dropout=0.1 (train.dropout_by_passes), train.min_lr=0.001 "
             "(train.floor_by_passes), train.weight_decay=0.5 (train.decay_by_passes)", (0.1, 1e-3, 0.5)),
    (150, 2, "0.71 passes", (0.1, 1e-3, 0.5)),
    # 0.4978 passes, short of the entries at 0.5: shown as 0.49, not as the 0.50 it rounds to
    (210, 1, "0.49 passes over the training text -> model.dropout=0.05 (train.dropout_by_passes), "
             "train.min_lr=0.0002 kept (train.floor_by_passes starts at 0.5)", (0.05, 2e-4, 0.25))],
    ids=["0.24", "0.71", "0.71-accumulating", "just-short-of-an-entry"])
def test_a_run_of_fixed_steps_takes_the_entries_for_the_passes_its_steps_make(
        corpus, tmp_path, monkeypatch, steps, accumulate, choices, chosen):
    """Without a time budget the passes are train.max_steps' own, exactly: 128 tokens a step (256
    accumulating two batches) over the training text's 54,000, so 100 steps make 0.24 passes and
    300 (or 150 of two batches) 0.71. The entries at or below them set the dropout, the schedule's
    floor and the weight decay from step 1; the run says so, config.yaml records them, and a run
    resumed with other tables in its --config keeps them."""
    clock = FakeClock()
    FakeMachine(monkeypatch, clock, lambda now, step: 0.125, compute=False, signal_at_step=steps // 2)
    seen = []  # per step: the model's dropout, the floor the schedule reads, the matrices' weight decay
    timed_step = Trainer.train_step
    monkeypatch.setattr(Trainer, "train_step", lambda trainer: (seen.append(
        (trainer.model.blocks[1].dropout.p, trainer.plan.config.min_lr,
         next(g["weight_decay"] for g in trainer.optimizers.optimizers[0].param_groups if g["name"] == "matrices"))),
        timed_step(trainer))[1])
    items = [*corpus_items(corpus, tmp_path), f"train.max_steps={steps}",
             f"train.grad_accum_steps={accumulate}"]
    first = train(load_config(TINY, items + FIXED_STEP_TABLES), run_name="run", progress=False, clock=clock)
    assert f"train.max_steps {steps}: {choices}" in (first.run_dir / "train.log").read_text()
    saved = load_config(first.run_dir / "config.yaml")
    assert (saved.model.dropout, saved.train.min_lr, saved.train.weight_decay) == chosen
    assert first.step == steps // 2 and set(seen) == {chosen}

    seen[:] = []  # forked with a --config whose tables differ: the file holds tables, the checkpoint the choices
    point = ResumePoint.find(ckpt.latest_checkpoint(first.run_dir), "with_config", tmp_path)
    other = ["train.dropout_by_passes={0: 0.2}", "train.floor_by_passes={0: 0.9}", "train.decay_by_passes={0: 0.9}"]
    resumed = train(load_config(TINY, items + other), resume=point, run_name="with_config", progress=False,
                    clock=clock)
    assert resumed.step == steps and set(seen) == {chosen}


@pytest.mark.parametrize("passes, digits, tables, shown", [
    (0.4978, 2, {"floor_by_passes": {0.5: 0.5}}, "0.49"),  # short of an entry: not shown as it
    (0.5, 2, {"floor_by_passes": {0.5: 0.5}}, "0.50"),  # at an entry
    (0.5004, 2, {"floor_by_passes": {0.5: 0.5}}, "0.50"),  # just above one
    (0.1211, 2, {"decay_by_passes": {0.121: 0.3}}, "0.121"),  # above an entry of more decimals
    (0.125, 2, {"decay_by_passes": {0.125: 0.3}}, "0.125"),  # at one that rounds to even below it
    (4.25, 1, {"decay_by_passes": {3.5: 0.2, 4.25: 0.3, 6: 0.5}}, "4.25"),  # the main config's, at 4.25
    (0.47, 1, {"decay_by_passes": {0.46: 0.1}, "floor_by_passes": {0.5: 0.5}}, "0.47"),  # neither way
    (0.73, 1, {}, "0.7"),
    (0.0034, 1, {}, "0.003"),  # a vast corpus under a short budget: not "0.0"
    (0.04, 1, {}, "0.04"),
    (0.0, 1, {}, "0.0")])
def test_a_count_of_passes_is_shown_on_the_side_of_each_entry_that_the_count_is(passes, digits, tables, shown):
    """The count a line shows reads as the tables read the count: an entry it reaches is reached by
    the number shown, and one it falls short of is not, whichever way rounding would go."""
    assert shown_passes(passes, digits, PassTables(load_config(TINY).train, **tables)) == shown


def test_a_choice_edited_in_config_yaml_wins_when_the_run_resumes(corpus, tmp_path, monkeypatch):
    """The run's config.yaml records what the tables chose; an edit there applies from the resume
    on (the run logs it), as any other edit does: the checkpoint's choice does not undo it."""
    clock = FakeClock()
    FakeMachine(monkeypatch, clock, lambda now, step: 0.125, compute=False, signal_at_step=50)
    decays = []
    timed_step = Trainer.train_step
    monkeypatch.setattr(Trainer, "train_step", lambda trainer: (decays.append(next(
        g["weight_decay"] for g in trainer.optimizers.optimizers[0].param_groups if g["name"] == "matrices")),
        timed_step(trainer))[1])
    items = [*corpus_items(corpus, tmp_path), "train.max_steps=100", "train.decay_by_passes={0.2: 0.25}"]
    first = train(load_config(TINY, items), run_name="run", progress=False, clock=clock)
    assert first.step == 50 and set(decays) == {0.25}
    path = first.run_dir / "config.yaml"
    path.write_text(path.read_text().replace("weight_decay: 0.25", "weight_decay: 0.05"))
    decays[:] = []
    point = ResumePoint.find(first.run_dir, None, tmp_path)
    resumed = train(point.edited_config(), resume=point, progress=False, clock=clock)
    assert resumed.step == 100 and set(decays) == {0.05}
    assert "train.weight_decay 0.25 -> 0.05" in (first.run_dir / "train.log").read_text()


def test_a_value_given_with_set_wins_over_its_table(corpus, tmp_path, monkeypatch):
    clock = FakeClock()
    FakeMachine(monkeypatch, clock, lambda now, step: 0.25, compute=False)
    items = ["train.dropout_by_passes={0: 0.3}", "model.dropout=0.05",
             "train.floor_by_passes={0: 0.5}", "train.min_lr=1e-4",
             "train.decay_by_passes={0: 0.5}", "train.weight_decay=0.05"]
    result = train(budget_config(corpus, tmp_path, "100s", *items), run_name="run", progress=False, clock=clock,
                   overrides=items)
    saved = load_config(result.run_dir / "config.yaml")
    assert (saved.model.dropout, saved.train.min_lr, saved.train.weight_decay) == (0.05, 1e-4, 0.05)
    assert "passes over the training text fit" not in (result.run_dir / "train.log").read_text()


@pytest.mark.parametrize("schedule", ["cosine", "linear", "wsd", "constant"])
def test_an_explicit_step_count_follows_the_step_schedule_to_its_last_step(schedule):
    config = load_config(TINY, ["train.lr=4.0e-3", "train.min_lr=4.0e-4", "train.warmup_steps=100",
                                "train.max_steps=437", f"train.schedule={schedule}"]).train
    from tinyattn.train.optim import StepPlan

    plan = StepPlan(config)
    assert [plan.factor(step) for step in range(437)] == [lr_factor(step, config) for step in range(437)]
    assert plan.factor(436) == pytest.approx(1.0 if schedule == "constant" else 0.1)
    assert plan.done(437) and not plan.done(436)


def test_the_progress_schedule_has_the_shapes_of_the_step_schedule():
    config = load_config(TINY, ["train.lr=1.0", "train.min_lr=0.1", "train.warmup_steps=10",
                                "train.schedule=cosine"]).train
    assert progress_lr_factor(3, 0.9, config) == pytest.approx(0.4)  # warmup counts steps
    assert progress_lr_factor(10, 0.0, config) == 1.0
    assert progress_lr_factor(50, 0.5, config) == pytest.approx(0.55)
    assert progress_lr_factor(50, 1.0, config) == pytest.approx(0.1)
    config.schedule = "constant"  # the peak to the end: no floor to decay to
    assert [progress_lr_factor(50, progress, config) for progress in (0.0, 0.5, 1.0)] == [1.0, 1.0, 1.0]
    config.schedule, config.decay_fraction = "wsd", 0.25  # the decay: the last quarter of the progress
    assert progress_lr_factor(50, 0.75, config) == 1.0
    assert progress_lr_factor(50, 0.875, config) == pytest.approx(0.55)
    assert progress_lr_factor(50, 1.0, config) == pytest.approx(0.1)


@pytest.mark.parametrize("schedule", ["cosine", "linear", "wsd"])
def test_a_progress_outside_zero_to_one_is_read_as_its_nearest_end(schedule):
    """progress_lr_factor clamps the progress (a plan's state read back from a checkpoint may hold
    any number): past 1 the rate stays at the floor, never below it; below 0 it stays at the peak."""
    config = load_config(TINY, ["train.lr=1.0", "train.min_lr=0.1", "train.warmup_steps=10",
                                f"train.schedule={schedule}", "train.decay_fraction=0.25"]).train
    assert progress_lr_factor(50, 1.5, config) == pytest.approx(progress_lr_factor(50, 1.0, config))
    assert progress_lr_factor(50, 1.5, config) == pytest.approx(0.1)
    assert progress_lr_factor(50, -0.5, config) == progress_lr_factor(50, 0.0, config) == 1.0


def test_the_steps_that_fit_count_the_evaluations_due_on_the_way():
    config = load_config(TINY, ["train.eval_interval=10"]).train
    clock = FakeClock(0.0)
    plan = TimePlan("100s", config, clock)
    # 100 s less 1.5 % and 1 s of exit: 97.5 s; less the last evaluation and write (2 + 0.5): 95 s.
    steps = plan.seed(step_seconds=1.0, eval_seconds=2.0, save_seconds=0.5)
    # n steps cost n s plus 2.5 s for each of the evaluations at steps 10, 20, ... before the last.
    assert steps == 77  # 77 s + 7 evaluations (10..70) * 2.5 = 94.5 <= 95; 78 would need 95.5 s
    assert steps == max(n for n in range(200) if n + ((n - 1) // 10) * 2.5 <= 95.0)
    clock.now = 97.0
    assert plan.steps_that_fit(0) == 0
    # A run whose last step lands on an evaluation step: that evaluation is the last one, counted once.
    clock.now = 0.0
    plan.seconds = (97.6 + TimePlan.EXIT_SECONDS + 2.5) / (1 - TimePlan.MARGIN)  # 97.6 s for steps
    assert plan.steps_that_fit(0) == 80  # 80 s + 7 evaluations (10..70) * 2.5 = 97.5 s; 81 would need 101


def test_the_steps_that_fit_after_a_later_step_count_the_evaluations_due_from_that_step():
    config = load_config(TINY, ["train.eval_interval=10"]).train
    plan = TimePlan("100s", config, FakeClock(0.0))
    plan.seed(step_seconds=1.0, eval_seconds=2.0, save_seconds=0.5)  # 95 s for steps, as above
    # From step 5, 75 steps end at step 80: 7 evaluations on the way (10..70), the one at 80 the
    # last: 75 + 7 * 2.5 = 92.5 s. 76 would pass 8 (10..80) on the way: 96 s. From step 0: 77.
    assert plan.steps_that_fit(5) == 75


def test_the_slowest_of_the_last_few_evaluations_and_writes_is_planned_for():
    config = load_config(TINY, ["train.eval_interval=10"]).train
    clock = FakeClock(0.0)
    plan = TimePlan("100s", config, clock)
    plan.seed(step_seconds=1.0, eval_seconds=0.5, save_seconds=0.5)

    def measured(kind, *seconds):
        for each in seconds:
            with plan.measuring(kind):
                clock.now += each
        clock.now = 0.0  # only the times recorded matter here, not the time they took

    def fitting(evaluation):  # 100 s less the margin and the exit, less the last evaluation and write
        left = 100 * (1 - TimePlan.MARGIN) - TimePlan.EXIT_SECONDS - evaluation
        return max(n for n in range(200) if n + ((n - 1) // 10) * evaluation <= left)

    measured("eval", 4.0, 0.5)
    measured("save", 1.5, 0.5)
    assert plan.steps_that_fit(0) == fitting(4.0 + 1.5) < fitting(0.5 + 0.5)  # the slowest, not the last
    measured("eval", *[0.5] * TimePlan.RECENT)
    measured("save", *[0.5] * TimePlan.RECENT)
    assert plan.steps_that_fit(0) == fitting(0.5 + 0.5)  # of the last few only: a slow one passes


def started_plan(warmup: int, eval_seconds: float, save_seconds: float):
    """A 1,000 s TimePlan on a fake clock, seeded with 1 s steps and started: (plan, clock, config)."""
    config = load_config(TINY, [f"train.warmup_steps={warmup}"]).train
    clock = FakeClock()
    plan = TimePlan("1000s", config, clock)
    plan.seed(1.0, eval_seconds, save_seconds)
    plan.start()
    return plan, clock, config


def test_the_plan_follows_the_last_steps_starts_after_warmup_and_a_finished_run_stays_finished():
    plan, clock, config = started_plan(5, 0.0, 0.0)
    for step in range(1, 2 * TimePlan.WINDOW + 1):  # a machine that halves its speed midway
        clock.now += 1.0 if step <= TimePlan.WINDOW else 2.0
        plan.after_step(step)
        if step == 5:
            assert plan.progress == 0.0  # still warming up: the schedule has not moved
        if step == 6:
            assert plan.progress > 0.0
    assert plan.times["step"] == [2.0] * TimePlan.WINDOW  # the median is of the latest steps
    clock.now = 999.0  # past the budget: the next step finishes the run
    plan.after_step(2 * TimePlan.WINDOW + 1)
    assert plan.done(63) and plan.progress == 1.0
    resumed = TimePlan("1000s", config, FakeClock())
    resumed.load_state_dict(plan.state_dict())
    assert resumed.done(63)  # a resumed finished run takes no step past its budget


def test_the_count_after_a_step_reads_that_steps_time():
    """The calibration measured 1 s a step; the first two steps take 3 s. The count after each
    includes it: 981 s left at the median of (1, 3) s, then 978 s at that of (1, 3, 3) s, not one
    step late."""
    plan, clock, _ = started_plan(0, 0.0, 0.0)  # 1,000 s: 984 s for steps
    left = []
    for step in (1, 2):
        clock.now += 3.0
        plan.after_step(step)
        left.append(plan.steps_left)
    assert left == [981 // 2, 978 // 3]


@pytest.mark.parametrize("warmup", [0, 3, 86])  # 86: the one step after warmup is the last (87 fit)
@pytest.mark.parametrize("schedule", ["cosine", "linear"])
def test_on_a_steady_machine_the_plan_steps_at_the_step_schedules_rates_for_the_steps_that_fit(
        warmup, schedule):
    """1 s steps after 10 s of start-up, no evaluation due: the rates are `lr_factor`'s for a run of
    train.max_steps = the steps that fit, step for step (the schedule spans exactly those steps,
    and the first is timed from the loop's start, not from the process's)."""
    config = load_config(TINY, [f"train.warmup_steps={warmup}", f"train.schedule={schedule}",
                                "train.eval_interval=100000"]).train
    clock = FakeClock(10.0)
    plan = TimePlan("100s", config, clock)
    steps = plan.seed(1.0, 0.0, 0.0)
    assert steps == 87  # 100 s less 1.5 %, 1 s of exit and 10 s spent: 87.5 s
    plan.start()
    rates, totals = [], []
    while not plan.done(len(rates)):
        totals.append(plan.total_steps(len(rates)))  # the run's length as planned before each step
        rates.append(plan.factor(len(rates)))
        clock.now += 1.0
        plan.after_step(len(rates))
    config.max_steps = steps
    assert rates == pytest.approx([lr_factor(step, config) for step in range(steps)], rel=1e-9, abs=1e-12)
    assert totals == [steps] * steps  # where the sampler ends the passes, and the progress bar's total
    assert rates[-1] == pytest.approx(config.min_lr / config.lr)  # the last step that fits: the floor


def test_a_step_that_fits_the_time_left_exactly_is_taken():
    config = load_config(TINY, ["train.eval_interval=100000"]).train
    clock = FakeClock(0.0)
    plan = TimePlan("200s", config, clock)
    plan.seed(1.0, 0.0, 0.0)
    clock.now = plan.seconds * (1 - TimePlan.MARGIN) - TimePlan.EXIT_SECONDS - 1.0  # 1 s left: one step
    assert plan.steps_that_fit(0) == 1
    clock.now += 0.25
    assert plan.steps_that_fit(0) == 0


def test_one_stalled_step_is_outvoted_and_does_not_shorten_the_plan():
    plan, clock, _ = started_plan(0, 0.0, 0.0)  # 1,000 s: 984 s for steps of 1 s
    for step in range(1, 11):
        clock.now += 30.0 if step == 5 else 1.0
        plan.after_step(step)
    assert plan.steps_left == 984 - 39  # the 39 s spent, at the median's 1 s a step


def test_a_plan_that_counts_every_few_steps_counts_down_between_as_one_that_counts_every_step():
    """A distributed run's rank 0 counts the steps that fit every replan_every steps and sends the
    count (`share`); between counts each rank counts down. On a steady machine that is the plan of
    a count after every step: the same steps left and the same progress, step for step."""
    config = load_config(TINY, ["train.warmup_steps=2", "train.eval_interval=100000"]).train
    clock, shared = FakeClock(), []
    every = TimePlan("100s", config, clock)
    few = TimePlan("100s", config, clock, replan_every=5, share=lambda count: shared.append(count) or count)
    for plan in (every, few):
        plan.seed(1.0, 0.0, 0.0)
        plan.start()
    step = 0
    while not every.done(step):
        step += 1
        clock.now += 1.0
        for plan in (every, few):
            plan.after_step(step)
        assert (few.steps_left, few.progress, few.done(step)) == \
            (every.steps_left, every.progress, every.done(step))
    assert step == 97 and len(shared) == 1 + 97 // 5  # the seed's count, then one every 5 steps


def test_a_distributed_plan_counts_every_log_interval_steps_and_every_rank_takes_rank_0s_count(monkeypatch):
    """plan_for a distributed run: rank 0's count of the steps that fit reaches every rank (here a rank
    whose own count differs: rank 0 counted 40), at the start and every train.log_interval steps, and
    each rank counts down between."""
    from tinyattn.system.distributed import Distributed

    config = load_config(TINY, ["train.time_budget=100s", "train.log_interval=10", "train.eval_interval=25",
                                "train.warmup_steps=2"]).train
    sent = []

    def broadcast(tensor, src):  # torch.distributed's, as a rank other than 0 sees it
        sent.append((int(tensor.item()), src))
        tensor.fill_(40)

    monkeypatch.setattr(torch.distributed, "broadcast", broadcast)
    clock = FakeClock()
    plan = budget.plan_for(config, None, clock, dist=Distributed(rank=1, world_size=2),
                           device=torch.device("cpu"))
    assert plan.seed(1.0, 0.0, 0.0) == 40
    left = []
    for step in range(1, 31):
        clock.now += 1.0
        plan.after_step(step)
        left.append(plan.steps_left)
    assert left == [40 - step % 10 for step in range(1, 31)]
    assert len(sent) == 1 + 3 and {src for _, src in sent} == {0} and sent[0][0] > 40  # its own count: more


def test_no_step_is_timed_with_an_evaluation_in_it():
    plan, clock, _ = started_plan(0, 5.0, 1.0)
    for step in range(1, 40):  # the loop's order: the step, the plan, then an evaluation if due
        clock.now += 1.0
        plan.after_step(step)
        if step % 10 == 0:
            with plan.measuring("eval"):
                clock.now += 5.0
            with plan.measuring("save"):
                clock.now += 1.0
    assert plan.times["step"] == [1.0] * TimePlan.WINDOW
    assert plan.times["eval"] == [5.0] * TimePlan.RECENT and plan.times["save"] == [1.0] * TimePlan.RECENT


def assert_same_state(before, after, where="state"):
    """Two Trainer.state_dict()s hold the same values, tensor for tensor."""
    assert type(before) is type(after), where
    if isinstance(before, torch.Tensor):
        assert torch.equal(before, after), where
    elif isinstance(before, dict):
        assert before.keys() == after.keys(), where
        for key in before:
            assert_same_state(before[key], after[key], f"{where}[{key!r}]")
    elif isinstance(before, (list, tuple)):
        assert len(before) == len(after), where
        for i, (a, b) in enumerate(zip(before, after)):
            assert_same_state(a, b, f"{where}[{i}]")
    else:
        assert before == after, where


def test_the_calibrations_steps_are_undone(corpus, tmp_path, monkeypatch):
    """The calibration trains real steps (warm and timed) and evaluates; then the weights, the
    moving average, the optimizers, the scaler, the counters, the sampler and the random
    generators are back as they were before its first step."""
    import copy

    from tinyattn.data.batches import prepare_data
    from tinyattn.system.device import select_precision
    from tinyattn.train.passes import PassTables

    config = budget_config(corpus, tmp_path, "100s", "train.ema=0.9")
    data = prepare_data(config, progress=False)
    config.model.vocab_size = data.tokenizer.vocab_size
    cpu = torch.device("cpu")
    trainer = Trainer.build(config.model, config.train, data.train, device=cpu,
                            precision=select_precision("fp32", cpu))
    clock = FakeClock()
    machine = FakeMachine(monkeypatch, clock, lambda now, step: 0.5)  # 3 warm steps, 3 timed (1.5 s)
    trainer.plan = TimePlan("100s", config.train, clock)
    before = copy.deepcopy({k: v for k, v in trainer.state_dict().items() if k != "plan"})
    evaluator = Evaluator(trainer, config, data.validation, data.tokenizer)
    budget.Calibration(trainer.plan, clock, PassTables(config.train)).measure(trainer, evaluator, tmp_path)
    assert machine.calls == 6
    after = {k: v for k, v in trainer.state_dict().items() if k != "plan"}
    assert after["step"] == 0 and after["sampler"]["batches_drawn"] == 0
    assert_same_state(before, after)


def test_the_calibration_times_steps_for_its_share_of_the_budget_and_counts_the_hooks_and_start_up_apart(
        corpus, tmp_path, monkeypatch):
    """A 1200 s budget times 3 s of steps (MIN_SHARE, capped at 3 s), not the 1.5 s of a short one; the
    evaluation's time holds the train.show hooks (given DISCARD: they log nothing here); a write
    counts twice (a step checkpoint and best.pt); and the 2 s of start-up before it are not the
    measuring's own seconds, which the advice when no step fits adds to them. No probe file is left."""
    from tinyattn.data.batches import prepare_data
    from tinyattn.system.device import select_precision
    from tinyattn.train.hooks import DISCARD
    from tinyattn.train.passes import PassTables

    config = budget_config(corpus, tmp_path, "1200s")
    data = prepare_data(config, progress=False)
    config.model.vocab_size = data.tokenizer.vocab_size
    cpu = torch.device("cpu")
    trainer = Trainer.build(config.model, config.train, data.train, device=cpu,
                            precision=select_precision("fp32", cpu))
    clock = FakeClock(2.0)  # the start-up's seconds
    machine = FakeMachine(monkeypatch, clock, lambda now, step: 0.5, compute=False)
    real_save, hooked = ckpt.save_checkpoint, []

    def timed_save(state, path):  # a write takes 0.125 s
        real_save(state, path)
        clock.now += 0.125

    def slow_hook(shown):  # a train.show hook that takes 0.25 s
        hooked.append((shown.writer, shown.run_dir))
        clock.now += 0.25

    monkeypatch.setattr(ckpt, "save_checkpoint", timed_save)
    trainer.plan = TimePlan("1200s", config.train, clock)
    evaluator = Evaluator(trainer, config, data.validation, data.tokenizer)
    evaluator.hooks = [slow_hook]
    calibration = budget.Calibration(trainer.plan, clock, PassTables(config.train))
    measured = calibration.measure(trainer, evaluator, tmp_path)
    assert machine.calls == 3 + 6  # 3 warm steps, then 6 of 0.5 s timed: 3 s
    assert hooked == [(DISCARD, None)]
    assert measured == budget.Measured(step=0.5, evaluation=0.5 + 0.25, save=2 * 0.125, start_up=2.0,
                                       calibration=9 * 0.5 + 0.75 + 0.125)
    assert list(tmp_path.glob(".budget_probe*")) == []


def test_a_budget_its_start_up_spent_exactly_is_refused_before_anything_is_measured():
    """Nothing left after the margin and the exit: refused at once, with the advice, before a step is
    measured; a quarter second left is measured (the plan then says whether a step fits)."""
    from types import SimpleNamespace

    from tinyattn.train.passes import PassTables

    config = load_config(TINY, ["train.time_budget=100s"])
    gone = 100 * (1 - TimePlan.MARGIN) - TimePlan.EXIT_SECONDS

    class Measuring(Exception):
        pass

    def state_dict():
        raise Measuring  # the measuring's first act: the snapshot of the trainer

    trainer = SimpleNamespace(dist=SimpleNamespace(enabled=False), state_dict=state_dict)
    for spent, outcome in ((gone, TinyattnError), (gone - 0.25, Measuring)):
        calibration = budget.Calibration(TimePlan("100s", config.train, FakeClock(spent)), FakeClock(),
                                         PassTables(config.train))
        with pytest.raises(outcome) as raised:
            calibration.measure(trainer, None, Path("run"))
        if outcome is TinyattnError:
            assert re.fullmatch(r"train\.time_budget 100s: 98 s are gone before training, all the "
                                r"budget leaves; no step fits\. Give a budget of at least \d+s .*",
                                str(raised.value))



def test_a_distributed_rank_whose_start_up_spent_the_budget_measures_with_the_others_not_alone():
    """Each rank reads its own clock: one refusing alone before the measuring would leave the others
    in its collectives. Every rank measures, and rank 0's count says no step fits (`share`)."""
    from types import SimpleNamespace

    from tinyattn.train.passes import PassTables

    config = load_config(TINY, ["train.time_budget=100s"])

    class Measuring(Exception):
        pass

    def state_dict():
        raise Measuring

    trainer = SimpleNamespace(dist=SimpleNamespace(enabled=True), state_dict=state_dict)
    calibration = budget.Calibration(TimePlan("100s", config.train, FakeClock(100.0)), FakeClock(),
                                     PassTables(config.train))
    with pytest.raises(Measuring):
        calibration.measure(trainer, None, Path("run"))

def _fits_a_step(config, budget_seconds: int, spent: float, measured: budget.Measured) -> bool:
    """Whether a run under `budget_seconds` whose start-up and measuring spent `spent` fits a step."""
    plan = TimePlan(f"{budget_seconds}s", config.train, FakeClock(spent))
    return plan.seed(measured.step, measured.evaluation, measured.save) >= 1


def test_the_advised_budget_holds_the_measuring_a_slower_start_up_and_a_step():
    """tiny.yaml at 1s: 2.4 s of start-up gave "at least 5s", whose measuring (1.5 s timed, and
    untimed steps, an evaluation, a write) then left no step ("at least 6s"). The advice counts the
    measuring and a start-up up to a quarter slower; measured numbers injected, no run."""
    from tinyattn.train.passes import PassTables
    config = load_config(TINY, ["train.time_budget=1s"])
    calibration = budget.Calibration(TimePlan("1s", config.train, FakeClock(2.4)), FakeClock(), PassTables(config.train))
    slow_start = 2.4 * 1.25
    # Before anything is measured: the measuring's 1.5 s timed and 1 s more allowed.
    before = calibration.advised_budget(2.4)
    assert before == 7
    assert _fits_a_step(config, before, slow_start + 1.5 + 1.0, budget.Measured(0.004, 0.01, 0.02))
    assert not _fits_a_step(config, 5, 2.4 + 1.5 + 1.0, budget.Measured(0.004, 0.01, 0.02))  # the old advice
    # After it: its own 2.5 s counted, with the step, evaluation and writes it measured.
    measured = budget.Measured(0.25, 0.5, 0.25, start_up=2.5, calibration=2.5)
    after = calibration.advised_budget(2.5, measured)
    assert after == math.ceil((2.5 * 1.25 + 1.0 + 2.5 + 0.25 + 0.5 + 0.25) / (1 - TimePlan.MARGIN)) == 8
    assert _fits_a_step(config, after, 2.5 * 1.25 + 2.5, measured)
    assert not _fits_a_step(config, after - 1, 2.5 * 1.25 + 2.5, measured)
    # A start-up whose need falls just under a whole second: the plan's margin takes it over.
    measured = budget.Measured(0.25, 0.5, 0.25, start_up=4.36, calibration=2.5)
    after = calibration.advised_budget(4.36, measured)
    assert _fits_a_step(config, after, 4.36 * 1.25 + 2.5, measured)


def test_a_warmup_longer_than_the_steps_the_budget_first_fits_is_said_at_the_start(
        corpus, tmp_path, monkeypatch, capsys):
    """warmup 100 under a budget fitting about 70 steps ended at 70% of the rate, "schedule 100% done"."""
    clock = FakeClock()
    FakeMachine(monkeypatch, clock, lambda now, step: 0.25, compute=False)
    train(budget_config(corpus, tmp_path, "20s", "train.warmup_steps=100"), run_name="w", progress=False, clock=clock)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: train.warmup_steps")]
    assert len(lines) == 1 and re.fullmatch(
        r"warning: train\.warmup_steps=100 is not below the about (\d+) steps the 20s budget first fits: the rate "
        r"ends still warming up, at \d+% of its peak, and never decays; give fewer warmup steps "
        r"\(--set train\.warmup_steps=\d+\) or a longer train\.time_budget", lines[0]), lines


def test_each_evaluation_of_a_budget_run_says_the_time_spent_the_steps_left_and_the_schedule_done(
        corpus, tmp_path, monkeypatch, capsys):
    clock = FakeClock()
    FakeMachine(monkeypatch, clock, lambda now, step: 0.25, compute=False)
    train(budget_config(corpus, tmp_path, "20s"), run_name="n", progress=False, clock=clock)
    err = capsys.readouterr().err
    evaluations = re.findall(r"^step [\d,]+: validation loss", err, flags=re.M)
    notes = re.findall(r"^time budget 20s: \d+ s spent, about [\d,]+ more steps at [\d.]+ s/step, "
                       r"schedule (\d+)% done$", err, flags=re.M)
    assert len(notes) == len(evaluations) >= 2 and notes[-1] == "100", err


@pytest.mark.parametrize("compile", [True, False])
def test_a_budget_a_first_compile_spent_says_how_much_compiling_took(corpus, tmp_path, monkeypatch, compile):
    """A 60s budget on an empty inductor cache: 94 s gone and "give at least 100s", mostly the one-off
    compile, unsaid; the next run of the command fit 123 steps in 60 s. The refusal now says what the
    compiling took and that it need not be paid again, or avoided; without train.compile, nothing."""
    clock = FakeClock()
    FakeMachine(monkeypatch, clock, lambda now, step: 80.0 if now == 0 else 0.2, compute=False)
    config = budget_config(corpus, tmp_path, "60s", f"train.compile={str(compile).lower()}")
    with pytest.raises(TinyattnError, match=r"train.time_budget 60s: .* no step fits") as refused:
        train(config, run_name="cold", progress=False, clock=clock)
    message = str(refused.value)
    noted = ("80 s of them compiled the model (train.compile; inductor keeps what it compiled on disk, so "
             "the same command again may start sooner); --set train.compile=false trains without compiling. Give")
    assert (noted in message) == compile, message


def test_a_budget_measured_twice_for_a_dropout_notes_no_compiling_that_did_not_happen(
        corpus, tmp_path, monkeypatch, capsys):
    """With a dropout table the calibration warms up twice (the model with the dropout is measured
    too): six warm steps, none compiling, must not read as compile time. Nor does a run no step fits
    say how many passes fit, and what the tables made of them, before its refusal."""
    clock = FakeClock()
    FakeMachine(monkeypatch, clock, lambda now, step: 2.0, compute=False)
    config = budget_config(corpus, tmp_path, "12s", "train.compile=true", "model.dropout=0",
                           "train.dropout_by_passes={0: 0.1}", "model.attention_dropout=null")
    with pytest.raises(TinyattnError, match=r"train.time_budget 12s: .* no step fits") as refused:
        train(config, run_name="twice", progress=False, clock=clock)
    assert "compiled the model" not in str(refused.value), str(refused.value)
    printed = capsys.readouterr().err
    assert "measuring a few steps" in printed and "passes over the training text fit" not in printed, printed


def test_a_bare_number_budget_is_shown_with_its_unit_in_the_warmup_warning_and_the_resume_note():
    # "the 10 budget first fits" and "trained under a time budget of 10" were left unconverted.
    import types

    from tinyattn.train.optim import warmup_warning

    config = load_config(TINY, ["train.time_budget=10", "train.warmup_steps=50"])
    assert "steps the 10s budget first fits" in warmup_warning(config.train, 20, config.train.time_budget)
    resumed = types.SimpleNamespace(file=Path("runs/r/step_0000010.pt"), config=config, notes=[])
    ResumePoint._keep_budget(resumed, load_config(TINY), typed=())
    assert "trained under a time budget of 10s, which" in resumed.notes[0], resumed.notes


def test_a_step_count_given_with_set_turns_the_budget_off_and_without_a_budget_nothing_is_said():
    overrides = ["train.time_budget=10m", "train.max_steps=40"]
    config = load_config(TINY, overrides)
    assert budget.explicit_steps(config, overrides) == (
        "train.max_steps=40 given with --set: the time budget 10m is off for this run")
    assert config.train.time_budget is None and config.train.max_steps == 40
    plain = load_config(TINY, ["train.max_steps=40"])
    assert budget.explicit_steps(plain, ["train.max_steps=40"]) is None
