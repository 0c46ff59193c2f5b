"""The cost model: exact fits of what llama-server reports."""

import pytest

from proxy.cost import BATCH, CHUNK, ONE, CostModel, StepCost, kind_of


@pytest.mark.parametrize(
    ("evaluated", "ubatch", "kind"),
    [
        (1, 63, ONE),
        (0, 63, ONE),
        (2, 63, CHUNK),
        (500, 63, CHUNK),
        (63, 512, CHUNK),
        (64, 512, BATCH),
        (64, 0, BATCH),
        (64, 63, CHUNK),
    ],
)
def test_kind_of(evaluated, ubatch, kind):
    assert kind_of(evaluated, ubatch) == kind


def test_two_lengths_tell_the_weights_from_the_attention():
    # a = 4 ms per token, b = 1 us per token and row attended: 100 tokens from position 0
    # take 0.4 + 1e-6 * 100 * 50 = 0.405 s; 1,000 take 4 + 1e-6 * 1000 * 500 = 4.5 s
    cost = StepCost()
    cost.add(100, 0, 0.405)
    cost.add(1000, 0, 4.5)
    assert (cost.a, cost.b) == (pytest.approx(0.004, rel=1e-9), pytest.approx(1e-6, rel=1e-9))
    # 200 tokens after 300 reused, at positions seen: 0.8 + 1e-6 * 200 * 400
    assert cost.seconds(200, 300) == pytest.approx(0.88, rel=1e-9)
    # 500 after 1,000 (on average at 1,250): past the furthest position seen (500), the
    # attention is costed there: 2 + 1e-6 * 500 * 500, not 2 + 1e-6 * 500 * 1250
    assert cost.seconds(500, 1000) == pytest.approx(2.25, rel=1e-9)


def test_noise_on_short_steps_does_not_grow_into_a_long_prompts_cost():
    # 10 tokens in 50 ms and 300 in 2.4 s (a busy moment): b fits 5e-5 per token and row,
    # which would put 1,547 tokens at 0.005 * 1547 + 5e-5 * 1547 * 773.5 = 67.6 s
    cost = StepCost()
    cost.add(10, 0, 0.05 + 5e-5 * 10 * 5)
    cost.add(300, 0, 0.005 * 300 + 5e-5 * 300 * 150)
    assert (cost.a, cost.b) == (pytest.approx(0.005, rel=1e-6), pytest.approx(5e-5, rel=1e-6))
    # costed at the furthest position seen (150): 0.005 * 1547 + 5e-5 * 1547 * 150
    assert cost.seconds(1547, 0) == pytest.approx(0.005 * 1547 + 5e-5 * 1547 * 150, rel=1e-6)


def test_one_length_is_a_cost_per_token():
    cost = StepCost()
    assert cost.seconds(10, 0) is None
    cost.add(200, 0, 1.0)
    assert (cost.a, cost.b) == (0.005, 0.0)
    assert cost.seconds(10, 5000) == 0.05


def test_older_steps_weigh_less():
    # 0.97 for the first, 1 for the second: a = (0.97*1*0.002 + 1*1*0.004) / 1.97
    cost = StepCost()
    cost.add(1, 0, 0.002)
    cost.add(1, 0, 0.004)
    assert cost.a == pytest.approx((0.97 * 0.002 + 0.004) / 1.97, rel=1e-12) and cost.b == 0.0


def test_each_step_counts_once_whatever_its_length():
    # 500 tokens at 10 ms each (a slow moment), then 50 at 5 ms, both on average at
    # position 250 (the attention term cannot be told apart): the cost per token is the
    # steps' mean, the older weighing 0.97, (0.97 * 0.010 + 0.005) / 1.97; fitted on
    # seconds, the long step would weigh 100 times the short one and give 0.00995
    cost = StepCost()
    cost.add(500, 0, 5.0)
    cost.add(50, 225, 0.25)
    assert cost.a == pytest.approx((0.97 * 0.010 + 0.005) / 1.97, rel=1e-12) and cost.b == 0.0
    assert cost.seconds(100, 0) == pytest.approx(100 * (0.97 * 0.010 + 0.005) / 1.97, rel=1e-12)


def test_a_step_that_evaluated_nothing_teaches_nothing():
    cost = StepCost()
    cost.add(0, 300, 0.02)
    assert cost.a is None and cost.sxx == [0.0, 0.0, 0.0]


def test_a_kept_state_is_a_prior_of_one_step_that_estimates_nothing_alone():
    # ten steps at 20 ms per token, all on average at position 100 (a check on a busy
    # machine): kept, then taken by a new run, they weigh as one step of its own
    prior = {
        "fit": "per-token",
        "steps": {
            "one": {"sxx": [0.0, 0.0, 0.0], "sxy": [0.0, 0.0], "a": None, "b": 0.0, "reach": 0.0},
            "chunk": {
                "sxx": [10.0, 1000.0, 100000.0],
                "sxy": [0.2, 20.0],
                "a": 0.02,
                "b": 0.0,
                "reach": 100.0,
            },
            "batch": {"sxx": [0.0, 0.0, 0.0], "sxy": [0.0, 0.0], "a": None, "b": 0.0, "reach": 0.0},
        },
        "overhead_s": 0.001,
        "observed": 10,
    }
    model = CostModel()
    assert model.restore(prior)
    assert model.steps[CHUNK].sxx == pytest.approx([1.0, 100.0, 10000.0], rel=1e-12)
    assert model.step_s(CHUNK, 100, 50) is None  # nothing from the prior alone
    # one step of this run at 5 ms per token, at position 100 too: (0.97 * 0.02 + 0.005) /
    # 1.97 per token; taken whole, the prior would give (0.97 * 0.2 + 0.005) / 10.7
    model.observe(CHUNK, 100, 50, upstream_s=0.5, wall_s=0.5)
    assert model.steps[CHUNK].a == pytest.approx((0.97 * 0.02 + 0.005) / 1.97, rel=1e-12)
    assert model.step_s(CHUNK, 100, 50) == pytest.approx(100 * (0.97 * 0.02 + 0.005) / 1.97)


def test_a_kind_not_yet_seen_is_costed_as_its_neighbour_plus_the_time_around():
    model = CostModel()
    assert model.step_s(CHUNK, 100, 0) is None
    model.observe(CHUNK, 100, 0, upstream_s=0.5, wall_s=0.51)
    assert model.step_s(CHUNK, 100, 0) == pytest.approx(0.51, rel=1e-9)
    assert model.step_s(BATCH, 200, 0) == pytest.approx(1.01, rel=1e-9)  # the chunk's rate
    model.observe(ONE, 1, 100, upstream_s=0.02, wall_s=0.04)
    # the time around: 0.9 * 0.01 + 0.1 * 0.02
    assert model.overhead_s == pytest.approx(0.011, rel=1e-9)
    assert model.step_s(ONE, 1, 100) == pytest.approx(0.031, rel=1e-9)
