from hetbench.clock import median_interval


def test_the_medians_interval_is_the_range_for_few_values_and_narrows_with_more():
    assert median_interval([3.0, 1.0, 2.0]) == (1.0, 3.0)  # [x(2), x(2)] would cover 0%
    assert median_interval([5.0, 1.0, 4.0, 2.0, 3.0]) == (1.0, 5.0)  # [x(2), x(4)] covers 62.5%
    assert median_interval([float(v) for v in range(1, 7)]) == (2.0, 5.0)  # 78%
    assert median_interval([float(v) for v in range(1, 11)]) == (3.0, 8.0)  # 89%; [x(4), x(7)] 66%
    assert median_interval([float(v) for v in range(1, 11)], coverage=0.95) == (2.0, 9.0)  # 97.9%
    assert median_interval([7.0]) == (7.0, 7.0)
