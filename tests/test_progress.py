"""Progress while a run works: plain lines off a terminal, with the scenario, repeat, steps and ETA."""

import io

from hetbench import progress
from hetbench.progress import Progress


def test_off_a_terminal_progress_is_plain_lines_with_repeat_steps_and_eta(monkeypatch):
    monkeypatch.setattr(progress, "EVERY_S", 0.0)
    out = io.StringIO()
    with Progress("[2/5] ray-ps [auto]", total=4, repeats=2, out=out) as bar:
        bar.repeat(0)
        bar.update(1)
        bar.update(1)
        bar.repeat(1)
        bar.update(2)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("[2/5] ray-ps [auto]: repeat 1/2, step 1/4 (25%), ETA ")
    assert lines[-1] == "[2/5] ray-ps [auto]: repeat 2/2, step 4/4 (100%)"  # done: no ETA


def test_plain_lines_are_rate_limited_and_the_last_step_always_prints():
    out = io.StringIO()
    bar = Progress("single", total=100, repeats=1, out=out)
    for _ in range(100):
        bar.update(1)
    assert out.getvalue().splitlines() == ["single: repeat 1/1, step 100/100 (100%)"]


def test_steps_resumed_from_a_checkpoint_do_not_shorten_the_eta(monkeypatch):
    monkeypatch.setattr(progress, "EVERY_S", 0.0)
    out = io.StringIO()
    bar = Progress("x", total=10, repeats=1, out=out)
    bar.update(5, resumed=True)
    assert "ETA" not in out.getvalue().splitlines()[0]  # nothing ran in this process yet: no rate to go by
