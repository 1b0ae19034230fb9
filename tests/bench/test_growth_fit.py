import pytest

from turnkeep.bench.growth_fit import grows, growth_class, log_log_slope


def test_slope_of_a_power_law_is_its_power():
    sizes = [10, 100, 1000, 10000]
    assert log_log_slope(sizes, [3e-6 * s for s in sizes]) == pytest.approx(1.0)
    assert log_log_slope(sizes, [2e-9 * s**2 for s in sizes]) == pytest.approx(2.0)
    assert log_log_slope(sizes, [0.5 for _ in sizes]) == pytest.approx(0.0)


def test_a_time_too_small_to_measure_does_not_break_the_fit():
    assert log_log_slope([1, 10], [0.0, 0.0]) == pytest.approx(0.0)


def test_one_size_is_not_enough_for_a_slope():
    with pytest.raises(ValueError):
        log_log_slope([10, 10], [1.0, 2.0])


def test_classes_follow_the_thresholds():
    assert growth_class(0.05, "A") == "constant" and not grows(0.05)
    assert growth_class(-0.3, "A") == "constant"
    assert growth_class(0.95, "R") == "linear" and grows(0.95)
    assert growth_class(0.45, "A") == "~A^0.45"
    assert growth_class(1.9, "R") == "~R^1.9"
