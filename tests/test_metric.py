"""A workload is judged by accuracy where its labels are class indices, else by its test loss: which
way is better, how near is near, and how much worse a row may end, each in the metric's own terms."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hetbench.config import RunConfig
from hetbench.metric import ACCURACY, EVAL_BATCH, LOSS, correct, for_labels, mean_of
from hetbench.results.rows import steps_to_target, target_bracket_s
from hetbench.training import CurvePoint, Schedule


def test_class_indices_are_judged_by_accuracy_and_any_other_target_by_the_loss():
    assert for_labels(torch.tensor([0, 3])) is ACCURACY and for_labels(np.array([1, 2])) is ACCURACY
    assert for_labels(torch.zeros(4)) is LOSS and for_labels(np.zeros((4, 2), np.float32)) is LOSS
    assert for_labels(torch.zeros(4, 2, dtype=torch.long)) is LOSS  # several integers a sample: not one class


def test_a_loss_is_reached_from_above_and_a_row_falls_short_by_a_fraction_of_the_baselines():
    assert LOSS.reached(0.05, 0.05) and not LOSS.reached(0.06, 0.05)
    assert ACCURACY.reached(0.95, 0.95) and not ACCURACY.reached(0.94, 0.95)
    assert LOSS.near(0.059, 0.05, 0.2) and not LOSS.near(0.061, 0.05, 0.2)
    assert ACCURACY.near(0.76, 0.95, 0.2) and not ACCURACY.near(0.74, 0.95, 0.2)
    assert LOSS.shortfall(0.11, 0.10) == pytest.approx(0.1) and LOSS.shortfall(0.09, 0.10) == 0
    assert ACCURACY.shortfall(0.93, 0.95) == pytest.approx(0.02) and ACCURACY.shortfall(0.96, 0.95) == 0
    assert (LOSS.worse(0.1), ACCURACY.worse(0.021)) == ("10% higher in test loss", "2.1 points less accurate")
    assert (LOSS.at(0.05), ACCURACY.at(0.95), LOSS.format(0.012345)) == (
        "test loss 0.05",
        "95% test accuracy",
        "0.01235",
    )
    run = RunConfig(target_loss=0.3, loss_tolerance=0.04)
    assert (LOSS.target(run), LOSS.tolerance(run), ACCURACY.target(run)) == (0.3, 0.04, run.target_accuracy)


def test_the_test_loss_is_its_mean_over_every_sample_however_the_evaluation_batches_them():
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    n = EVAL_BATCH * 2 + 5  # a short last batch weighs by its size
    inputs, targets, labels = torch.randn(n, 3), torch.randn(n, 2), torch.randint(0, 2, (n,))
    with torch.no_grad():
        whole = float(F.mse_loss(model(inputs), targets))
        right = (model(inputs).argmax(1) == labels).sum().item() / n
    assert LOSS.measure(model, inputs, targets, mean_of(F.mse_loss)) == pytest.approx(whole, rel=1e-6)
    assert ACCURACY.measure(model, inputs, labels, correct) == pytest.approx(right)
    assert model.training  # put back as it was found


def test_a_schedule_toward_a_loss_goes_fine_just_above_it_and_the_curve_reaches_it_from_above():
    schedule = Schedule.of(RunConfig(target_loss=0.5, fine_eval_within=0.2, fine_eval_every=2), LOSS)
    curve = [CurvePoint(10, 1.0, 0.9), CurvePoint(20, 2.0, 0.58)]
    assert not schedule.near(curve[:1]) and schedule.near(curve)  # 0.58 is within 20% above 0.5
    reached = [*curve, CurvePoint(22, 2.2, 0.49)]
    assert not schedule.near(reached)  # reached: back to eval_every
    assert steps_to_target(reached, 0.5, LOSS) == 22 and target_bracket_s(reached, 0.5, LOSS) == pytest.approx(0.2)
    assert steps_to_target(reached, 0.5) == 10  # read as an accuracy, 0.9 is past 50% at the first check
