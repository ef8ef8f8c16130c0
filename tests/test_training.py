"""The training loop's Schedule: which steps are checked (fine near the target), which repeats are."""

import pytest

from helpers import small_config
from hetbench.progress import Progress
from hetbench.results.rows import steps_to_target, target_bracket_s
from hetbench.step_timing import StepTiming
from hetbench.strategies.base import Strategy
from hetbench.training import Schedule, train_repeat


class Climbing(Strategy):
    """Trains nothing: its weights are the steps it took, which `accuracy` reads as step / 50."""

    name = "climbing"

    def start(self) -> None: ...

    def reset(self, seed: int) -> None:
        self.taken, self.thens = 0, []

    def weights(self):
        return self.taken

    def worker_info(self) -> list[dict]:
        return []

    def step(self, step: int, then: int | None = None) -> StepTiming:
        self.taken = step + 1
        self.thens.append(then)
        return StepTiming({"w": 0.01}, comm_s=0.0, wait_s=0.0, total_s=0.01)


def accuracy(taken: int, full: bool = False) -> float:
    return taken / 50


def test_checks_go_fine_near_the_target_and_back_once_it_is_reached(tmp_path):
    settings = ["steps=60", "warmup_steps=0", "eval_every=10", "fine_eval_every=2", "fine_eval_within=0.15"]
    cfg = small_config(tmp_path, *settings, "target_accuracy=0.9")
    strategy = Climbing(cfg.job())
    with Progress("climbing", 60, 1) as bar:
        result = train_repeat(
            strategy, Schedule.of(cfg.run), repeat=0, evaluate=accuracy, bar=bar, seed=0, samples_per_step=64
        )
    # 0.8 at step 40 is within 0.15 of 0.9: every 2 steps until 0.92 at step 46, then every 10 again
    checked = [10, 20, 30, 40, 42, 44, 46, 50, 60]
    assert [p.step for p in result.curve] == checked
    # no step before a check started the next one early
    assert [n + 1 for n, then in enumerate(strategy.thens) if then is None] == checked
    assert result.time_to_target_s == pytest.approx(0.46)
    assert steps_to_target(result.curve, 0.9) == 46
    # the crossing lies between the checks at steps 44 and 46: two steps of 0.01 s
    assert target_bracket_s(result.curve, 0.9) == pytest.approx(0.02)


def test_without_fine_checks_the_crossing_is_known_to_eval_every(tmp_path):
    cfg = small_config(tmp_path, "steps=60", "warmup_steps=0", "eval_every=10", "fine_eval_every=0")
    strategy = Climbing(cfg.job())
    with Progress("climbing", 60, 1) as bar:
        result = train_repeat(
            strategy, Schedule.of(cfg.run), repeat=0, evaluate=accuracy, bar=bar, seed=0, samples_per_step=64
        )
    assert [p.step for p in result.curve] == [10, 20, 30, 40, 50, 60]
    assert target_bracket_s(result.curve, 0.9) == pytest.approx(0.1)


def test_speed_steps_leave_the_first_evaluated_repeats_whole(tmp_path):
    schedule = Schedule.of(small_config(tmp_path, "steps=60", "warmup_steps=5", "speed_steps=20").run)
    assert [schedule.total(r) for r in range(5)] == [65, 65, 65, 25, 25]  # evaluated_repeats: 3
    assert [schedule.evaluates(r, 64) for r in range(5)] == [True, True, True, False, False]
    one = Schedule.of(small_config(tmp_path, "steps=60", "speed_steps=20", "evaluated_repeats=1").run)
    assert [one.evaluated(r) for r in range(3)] == [True, False, False]
    every = Schedule.of(small_config(tmp_path, "repeats=5", "evaluated_repeats=1").run)  # no speed_steps
    assert all(every.evaluated(r) for r in range(5))
