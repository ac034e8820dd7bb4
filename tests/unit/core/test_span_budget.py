"""The phase-span budget: whole iterations within the rate, one larger than a second's worth still sent when the bucket is full."""

from __future__ import annotations

import numpy as np

from otel_rl.core.sampling import SpanBudget, SpanSampler


def test_iterations_within_the_rate_go_out_whole_and_the_rest_are_counted():
    budget = SpanBudget(100)
    kept = budget.take_each([30, 30, 30, 30], now_s=0.0)
    assert kept == [0, 1, 2] and budget.sampled_out == 30
    assert budget.take_each([30], now_s=0.1) == []  # 10 tokens back: not enough
    assert budget.take_each([30], now_s=0.4) == [0]  # 40 back


def test_an_iteration_larger_than_a_second_of_budget_goes_out_when_the_bucket_is_full_and_leaves_it_in_debt():
    """An env runner's sample call of 2,500 phases against 1,000 spans/s: sent once the bucket is full, then paid for."""
    sampler = SpanSampler(SpanBudget(1000))
    iteration_ids, phase_ids = sampler.iterations(np.array([2500]), now_s=0.0)
    assert iteration_ids[0] != 0 and np.count_nonzero(phase_ids) == 2500
    assert sampler.iterations(np.array([10]), now_s=1.0)[0][0] == 0  # 1,000 back of a 1,500 debt: still waiting
    assert sampler.iterations(np.array([2500]), now_s=2.6)[0][0] != 0  # the debt paid and the bucket full again
    assert sampler.sampled_out == 11


def test_a_budget_of_zero_sends_nothing():
    budget = SpanBudget(0)
    assert budget.take_each([1, 5000], now_s=0.0) == [] and not budget.take(1, now_s=1.0)
