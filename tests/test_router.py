"""Routing (inference/router.py): precedence org pin > request > experiment > tier default, then
canaries; stable arms and canary shares; load shedding thresholds."""

from __future__ import annotations

from collections import Counter

import pytest
from django.conf import settings
from django.test import override_settings

from core import metrics
from inference.pools import PoolSet, pools_load
from inference.router import (
    Overloaded,
    Route,
    RouteError,
    RouteRequest,
    experiment_arm,
    in_canary,
    route,
    routing_config_errors,
    shed,
)
from tests.pools_support import entry, frontier, remote

EXPERIMENT = {
    "name": "mini-vs-frontier",
    "tier": "free",
    "arms": {"control": 50, "treatment": 50},
    "pools": {"control": "mini", "treatment": "frontier"},
}
CANARY = {"pool": "frontier", "version": "2", "tier": "paid", "percent": 10}


@pytest.fixture
def pools() -> PoolSet:
    return pools_load(
        [
            entry(),
            frontier(),
            frontier(version="2"),
            entry("reasoning", priority=0, max_tokens=1024, tiers=["paid", "enterprise"]),
            remote(),
        ]
    )


def pick(pools, *, user_id=1, tier="paid", requested=None, org_pin="", flags=(), canaries=(), experiments=()):
    return route(
        RouteRequest(user_id=user_id, tier=tier, requested=requested, org_pin=org_pin, flags=frozenset(flags)),
        pools=pools, canaries=list(canaries), experiments=list(experiments),
    )  # fmt: skip


def users_where(predicate, n=10_000) -> list[int]:
    return [uid for uid in range(1, n + 1) if predicate(uid)]


# --- precedence ---


def test_tier_default_when_nothing_is_asked(pools):
    chosen = pick(pools, tier="free")
    assert (chosen.pool.key, chosen.reason, chosen.priority) == ("mini@1", "tier default", 1)
    chosen = pick(pools, tier="paid")
    assert (chosen.pool.key, chosen.reason, chosen.priority) == ("frontier@1", "tier default", 0)


def test_requested_pool_is_used_when_the_tier_allows_it(pools):
    chosen = pick(pools, tier="paid", requested="reasoning")
    assert (chosen.pool.name, chosen.reason) == ("reasoning", "requested")


def test_org_pin_beats_the_request(pools):
    chosen = pick(pools, tier="enterprise", requested="mini", org_pin="frontier@2")
    assert (chosen.pool.key, chosen.reason) == ("frontier@2", "org pin")


def test_org_pin_must_name_an_existing_exact_version(pools):
    with pytest.raises(RouteError) as caught:
        pick(pools, tier="enterprise", org_pin="frontier@7")
    assert caught.value.status == 400 and "frontier@7" in caught.value.message
    with pytest.raises(RouteError) as caught:
        pick(pools, tier="enterprise", org_pin="frontier")
    assert caught.value.status == 400 and "name@version" in caught.value.message


def test_a_pinned_org_is_never_moved_by_a_canary(pools):
    everyone = {**CANARY, "tier": "enterprise", "percent": 100}
    chosen = pick(pools, tier="enterprise", org_pin="frontier@1", canaries=[everyone])
    assert chosen.pool.key == "frontier@1"


def test_unknown_model_is_a_400_listing_the_models(pools):
    with pytest.raises(RouteError) as caught:
        pick(pools, tier="paid", requested="gpt-9")
    err = caught.value
    assert (err.status, err.code) == (400, "model_not_found")
    assert "gpt-9" in err.message
    for name in ("mini", "frontier", "reasoning", "remote-big"):
        assert name in err.message


def test_model_outside_the_tier_is_a_403_naming_the_tiers_models(pools):
    with pytest.raises(RouteError) as caught:
        pick(pools, tier="free", requested="frontier")
    err = caught.value
    assert (err.status, err.code) == (403, "model_not_allowed")
    assert "free" in err.message and "Your models: mini." in err.message


def test_exact_version_outside_the_tier_is_refused_too(pools):
    with pytest.raises(RouteError) as caught:
        pick(pools, tier="free", requested="frontier@2")
    assert caught.value.status == 403


@override_settings(CHAT_FLAG_POOLS={"beta-frontier": "frontier"})
def test_a_feature_flag_opens_a_pool_beyond_the_tier(pools):
    chosen = pick(pools, tier="free", requested="frontier", flags=["beta-frontier"])
    assert (chosen.pool.name, chosen.reason) == ("frontier", "requested")
    with pytest.raises(RouteError):
        pick(pools, tier="free", requested="reasoning", flags=["beta-frontier"])


def test_the_served_model_name_means_the_tier_default(pools):
    chosen = pick(pools, tier="paid", requested=settings.CHAT_MODEL_NAME)
    assert (chosen.pool.name, chosen.reason) == ("frontier", "tier default")


def test_a_remote_pools_model_name_selects_that_pool(pools):
    chosen = pick(pools, tier="enterprise", requested="big-model")
    assert (chosen.pool.name, chosen.reason) == ("remote-big", "requested")
    with pytest.raises(RouteError) as caught:
        pick(pools, tier="paid", requested="big-model")
    assert caught.value.status == 403


def test_experiment_arm_picks_the_pool_when_nothing_is_asked(pools):
    arms = {pick(pools, user_id=uid, tier="free", experiments=[EXPERIMENT]).reason for uid in range(1, 200)}
    assert arms == {"experiment mini-vs-frontier:control", "experiment mini-vs-frontier:treatment"}
    treated = users_where(
        lambda uid: experiment_arm(user_id=uid, experiment="mini-vs-frontier", weights=EXPERIMENT["arms"])
        == "treatment",
        n=200,
    )
    assert pick(pools, user_id=treated[0], tier="free", experiments=[EXPERIMENT]).pool.name == "frontier"


def test_a_request_beats_the_experiment(pools):
    treated = users_where(
        lambda uid: experiment_arm(user_id=uid, experiment="mini-vs-frontier", weights=EXPERIMENT["arms"])
        == "treatment",
        n=200,
    )
    chosen = pick(pools, user_id=treated[0], tier="free", requested="mini", experiments=[EXPERIMENT])
    assert (chosen.pool.name, chosen.reason) == ("mini", "requested")


def test_an_experiment_applies_only_to_its_tier(pools):
    for uid in range(1, 50):
        assert pick(pools, user_id=uid, tier="paid", experiments=[EXPERIMENT]).reason == "tier default"


# --- stable arms ---


def test_experiment_arm_is_stable_for_a_user():
    weights = {"a": 1, "b": 1, "c": 1}
    first = [experiment_arm(user_id=uid, experiment="e", weights=weights) for uid in range(500)]
    again = [experiment_arm(user_id=uid, experiment="e", weights=dict(reversed(weights.items()))) for uid in range(500)]
    assert first == again  # also when the config lists the arms in another order
    assert len(set(first)) == 3


def test_experiment_split_matches_the_weights_over_10k_users():
    counts = Counter(
        experiment_arm(user_id=uid, experiment="split", weights={"a": 70, "b": 20, "c": 10})
        for uid in range(1, 10_001)
    )
    assert abs(counts["a"] - 7000) < 250
    assert abs(counts["b"] - 2000) < 200
    assert abs(counts["c"] - 1000) < 150


def test_different_experiments_split_users_independently():
    weights = {"a": 1, "b": 1}
    one = [experiment_arm(user_id=uid, experiment="one", weights=weights) for uid in range(1000)]
    two = [experiment_arm(user_id=uid, experiment="two", weights=weights) for uid in range(1000)]
    agree = sum(x == y for x, y in zip(one, two, strict=True))
    assert 400 < agree < 600


def test_an_arm_of_weight_zero_gets_no_one():
    arms = {experiment_arm(user_id=uid, experiment="e", weights={"on": 1, "off": 0}) for uid in range(300)}
    assert arms == {"on"}
    with pytest.raises(ValueError):
        experiment_arm(user_id=1, experiment="e", weights={"off": 0})


# --- canaries ---


def test_canary_takes_its_percent_of_the_tier(pools):
    routed = Counter(pick(pools, user_id=uid, tier="paid", canaries=[CANARY]).pool.key for uid in range(1, 10_001))
    assert abs(routed["frontier@2"] - 1000) < 150
    assert routed["frontier@2"] + routed["frontier@1"] == 10_000


def test_canary_is_stable_per_user(pools):
    inside = users_where(lambda uid: in_canary(user_id=uid, key="frontier@2", percent=10), n=300)
    for uid in inside:
        chosen = pick(pools, user_id=uid, tier="paid", canaries=[CANARY])
        assert (chosen.pool.key, chosen.reason) == ("frontier@2", "canary")
    outside = next(uid for uid in range(1, 300) if uid not in inside)
    assert pick(pools, user_id=outside, tier="paid", canaries=[CANARY]).pool.key == "frontier@1"


def test_canary_only_touches_its_tier_and_pool(pools):
    everyone = {**CANARY, "percent": 100}
    assert pick(pools, user_id=5, tier="enterprise", canaries=[everyone]).pool.key == "frontier@1"
    assert pick(pools, user_id=5, tier="paid", requested="mini", canaries=[everyone]).pool.key == "mini@1"
    assert pick(pools, user_id=5, tier="paid", canaries=[everyone]).pool.key == "frontier@2"


def test_canary_applies_to_a_requested_name_but_not_an_exact_version(pools):
    everyone = {**CANARY, "percent": 100}
    assert pick(pools, tier="paid", requested="frontier", canaries=[everyone]).pool.key == "frontier@2"
    assert pick(pools, tier="paid", requested="frontier@1", canaries=[everyone]).pool.key == "frontier@1"


def test_zero_percent_canary_takes_no_one():
    assert not any(in_canary(user_id=uid, key="x@2", percent=0) for uid in range(1000))
    assert all(in_canary(user_id=uid, key="x@2", percent=100) for uid in range(1000))


# --- load shedding ---

THRESHOLDS = {
    "CHAT_SHED_FREE_WAITING": 4,
    "CHAT_DEGRADE_PAID_WAITING": 8,
    "CHAT_REASONING_LAST_WAITING": 2,
    "CHAT_SHED_RETRY_AFTER_S": 7,
}


def shed_count(tier: str, action: str) -> float:
    return metrics.value("chat_shed_total", tier=tier, action=action)


@override_settings(**THRESHOLDS)
def test_free_turns_are_shed_above_their_threshold(pools):
    free = pick(pools, tier="free")
    assert shed(free, tier="free", waiting=4, pools=pools) == free
    before = shed_count("free", "shed")
    with pytest.raises(Overloaded) as caught:
        shed(free, tier="free", waiting=5, pools=pools)
    assert caught.value.retry_after_s == 7 and "7" in caught.value.message
    assert shed_count("free", "shed") == before + 1


@override_settings(**{**THRESHOLDS, "CHAT_SHED_RETRY_AFTER_S": 0})
def test_retry_after_is_at_least_one_second(pools):
    with pytest.raises(Overloaded) as caught:
        shed(pick(pools, tier="free"), tier="free", waiting=100, pools=pools)
    assert caught.value.retry_after_s == 1


@override_settings(**THRESHOLDS)
def test_paid_turns_are_not_shed_but_degraded_to_mini_above_their_threshold(pools):
    paid = pick(pools, tier="paid")
    assert shed(paid, tier="paid", waiting=8, pools=pools) == paid  # above free's, not paid's
    before = shed_count("enterprise", "degrade")
    degraded = shed(pick(pools, tier="enterprise"), tier="enterprise", waiting=9, pools=pools)
    assert (degraded.pool.name, degraded.reason) == ("mini", "degraded")
    assert degraded.priority == 0  # keeps the paid turn's place in the queue
    assert shed_count("enterprise", "degrade") == before + 1
    on_mini = pick(pools, tier="paid", requested="mini")
    assert shed(on_mini, tier="paid", waiting=100, pools=pools) == on_mini


@override_settings(**THRESHOLDS)
def test_reasoning_turns_queue_last_above_their_threshold(pools):
    reasoning = pick(pools, tier="paid", requested="reasoning")
    assert shed(reasoning, tier="paid", waiting=2, pools=pools).priority == 0
    before = shed_count("paid", "queue_last")
    last = shed(reasoning, tier="paid", waiting=3, pools=pools)
    assert last.pool.name == "reasoning"
    assert last.priority == max(p.priority for p in pools) + 1 == 2
    assert last.priority < settings.CHAT_BACKGROUND_PRIORITY  # background jobs still behind
    assert shed_count("paid", "queue_last") == before + 1
    frontier_turn = pick(pools, tier="paid")
    assert shed(frontier_turn, tier="paid", waiting=3, pools=pools) == frontier_turn


def test_thresholds_are_read_at_call_time(pools):
    free = pick(pools, tier="free")
    with override_settings(CHAT_SHED_FREE_WAITING=100):
        assert shed(free, tier="free", waiting=50, pools=pools) == free
    with override_settings(CHAT_SHED_FREE_WAITING=10), pytest.raises(Overloaded):
        shed(free, tier="free", waiting=50, pools=pools)


def test_route_is_frozen(pools):
    chosen = pick(pools)
    assert isinstance(chosen, Route)
    with pytest.raises(AttributeError):
        chosen.priority = 5


# --- routing settings ---


def test_routing_config_errors_name_the_entry_and_field(pools):
    errors = routing_config_errors(
        pools,
        canaries=[{"pool": "frontier", "version": "2", "percent": 150}, {"pool": "frontier"}],
        experiments=[{"name": "e", "arms": {"a": 0}, "pools": {"a": "mini"}}],
        flag_pools={"ok": "frontier"},
    )
    assert errors == [
        "CHAT_CANARIES[0]: field 'percent': 150 is not between 0 and 100",
        "CHAT_CANARIES[1]: needs fields 'pool', 'version' and 'percent'",
        "CHAT_EXPERIMENTS[0]: field 'arms': weights must be integers >= 0, at least one > 0",
    ]
    assert routing_config_errors(pools, canaries=[CANARY], experiments=[EXPERIMENT], flag_pools={}) == []


# --- the design's shedding order, with the default thresholds (issue 17) ---


def test_with_default_thresholds_free_is_shed_before_paid_is_degraded_before_reasoning_queues(pools):
    """Given the default thresholds; when the queue deepens one request at a time; then the
    first action taken is shedding free turns, the next degrading paid turns to mini, and only
    then do reasoning turns queue last (DESIGN.md: free first, then paid, reasoning last)."""
    free, paid = pick(pools, tier="free"), pick(pools, tier="paid")
    reasoning = pick(pools, tier="paid", requested="reasoning")
    first_at: dict[str, int] = {}
    for waiting in range(0, 64):
        try:
            shed(free, tier="free", waiting=waiting, pools=pools)
        except Overloaded:
            first_at.setdefault("shed free", waiting)
        if shed(paid, tier="paid", waiting=waiting, pools=pools).reason == "degraded":
            first_at.setdefault("degrade paid", waiting)
        if shed(reasoning, tier="paid", waiting=waiting, pools=pools).priority > reasoning.priority:
            first_at.setdefault("queue reasoning", waiting)
    assert first_at == {"shed free": 9, "degrade paid": 17, "queue reasoning": 25}


@override_settings(**THRESHOLDS)
def test_a_reasoning_turn_is_never_degraded_to_mini(pools):
    """Given a queue far past the paid degrade threshold; when a paid reasoning turn is shed;
    then it stays on the reasoning pool (queued last) instead of moving to mini."""
    reasoning = pick(pools, tier="paid", requested="reasoning")
    routed = shed(reasoning, tier="paid", waiting=1000, pools=pools)
    assert routed.pool.name == "reasoning"
    assert routed.priority > reasoning.priority


@pytest.mark.parametrize(
    "free, paid, reasoning",
    [(16, 32, 8), (8, 8, 24), (30, 16, 24)],
)
def test_thresholds_out_of_the_design_order_get_a_system_check_warning(free, paid, reasoning):
    """chat.W004: thresholds should rise free < paid < reasoning; the old defaults (16, 32, 8)
    queued reasoning first and are warned about."""
    from django.core import checks  # noqa: PLC0415

    with override_settings(
        CHAT_SHED_FREE_WAITING=free, CHAT_DEGRADE_PAID_WAITING=paid, CHAT_REASONING_LAST_WAITING=reasoning
    ):
        errors = [e for e in checks.run_checks(tags=["chat"]) if e.id == "chat.W004"]
    assert len(errors) == 1 and "out of order" in errors[0].msg


def test_default_thresholds_pass_the_system_check():
    from django.core import checks  # noqa: PLC0415

    assert not [e for e in checks.run_checks(tags=["chat"]) if e.id == "chat.W004"]
