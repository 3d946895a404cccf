"""The cost model that decides which batches of a lone instance run on the event loop."""

from __future__ import annotations

import pytest

from reference_server.scheduling.execute import RunCost


def test_nothing_is_expected_before_a_batch_is_measured() -> None:
    assert RunCost().expected_ns(256) == 0


def test_batches_of_one_size_give_a_cost_proportional_to_the_elements() -> None:
    cost = RunCost()
    for _ in range(5):
        cost.record(256, 100_000)
    assert cost.expected_ns(256) == pytest.approx(100_000)
    assert cost.expected_ns(1024) == pytest.approx(400_000)  # errs high until a larger batch is seen


def test_a_fixed_part_and_a_part_per_element_are_told_apart() -> None:
    # A small MLP: ~90 us for any batch (reading its weights) plus 100 ns an element.
    cost = RunCost()
    for elements in (256, 512, 256, 2048, 768, 256, 4096, 512):
        cost.record(elements, 90_000 + 100 * elements)
    assert cost.expected_ns(256) == pytest.approx(90_000 + 25_600, rel=1e-6)
    # Proportional scaling from the small batches would expect 16 x 116 us = 1.85 ms here.
    assert cost.expected_ns(4096) == pytest.approx(90_000 + 409_600, rel=1e-6)


def test_recent_batches_weigh_more_than_old_ones() -> None:
    cost = RunCost()
    for _ in range(20):
        cost.record(256, 100_000)
    cost.record(256, 20_000_000)  # the model became slow
    assert cost.expected_ns(256) > 1_000_000  # one run moves the estimate over the inline bound
    for _ in range(30):
        cost.record(256, 100_000)
    assert cost.expected_ns(256) < 110_000  # and it comes back once the runs are cheap again


def test_a_fit_that_would_expect_a_negative_fixed_part_falls_back_to_proportional() -> None:
    cost = RunCost()
    cost.record(100, 10_000)
    cost.record(1000, 1_000_000)  # steeper than proportional: the line crosses zero before 0 elements
    # The older batch weighs 3/4: the weighted cost per element, times the elements.
    assert cost.expected_ns(100) == pytest.approx((0.75 * 10_000 + 1_000_000) / (0.75 * 100 + 1000) * 100)
