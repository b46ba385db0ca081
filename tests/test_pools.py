"""Model pool configuration (inference/pools.py): validation, YAML files, lookup, cost, and the
start-up system check (inference/checks.py). The engines each pool gets and the remote
client's wire format: test_pools_engines.py."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.conf import settings
from django.core import checks
from django.test import override_settings

from accounts.models import Tier
from inference.checks import check_model_pools
from inference.pools import TIERS, PoolConfigError, PoolSet, pool_set, pool_set_reset, pools_load
from tests.pools_support import (
    _fresh_pools,  # noqa: F401 - autouse
    entry,
    frontier,
    load_error,
    remote,
)

# --- validation: each rule names the pool and the field ---


def test_valid_config_loads_in_order():
    pools = pools_load([entry(), frontier(), remote()])
    assert [p.key for p in pools] == ["mini@1", "frontier@1", "remote-big@1"]


def test_default_settings_define_the_briefs_three_pools_with_its_prices():
    pools = pools_load(list(settings.CHAT_POOLS))
    assert pools.names() == ["mini", "frontier", "reasoning"]
    mini, front, reasoning = (pools.get(n) for n in pools.names())
    assert (mini.price_input_per_m, mini.price_output_per_m) == (Decimal("0.75"), Decimal("4.50"))
    assert (front.price_input_per_m, front.price_output_per_m) == (Decimal("5.00"), Decimal("30.00"))
    assert front.priority < mini.priority  # paid first
    assert reasoning.system_preamble and reasoning.max_tokens > front.max_tokens
    # One model for all three (docs/tiers-and-limits.md and /settings/ say so).
    assert {p.model_path for p in pools} == {str(settings.CHAT_MODEL_PATH)}
    assert {p.model for p in pools} == {settings.CHAT_MODEL_NAME}


def test_unknown_backend_is_refused_naming_pool_and_field():
    message = load_error([entry(backend="gpu"), frontier()])
    assert "'mini'" in message and "'backend'" in message


def test_remote_pool_without_url_is_refused():
    message = load_error([entry(), frontier(), remote(url="")])
    assert "'remote-big'" in message and "'url'" in message


def test_remote_pool_without_model_name_is_refused():
    message = load_error([entry(), frontier(), remote(model="")])
    assert "'remote-big'" in message and "'model'" in message


def test_local_pool_with_missing_model_folder_is_refused(tmp_path):
    missing = tmp_path / "no-such-model"
    message = load_error([entry(), frontier(model_path=str(missing))])
    assert "'frontier'" in message and "'model_path'" in message and str(missing) in message


def test_local_pool_on_another_existing_folder_is_accepted(tmp_path):
    pools = pools_load([entry(), frontier(model_path=str(tmp_path))])
    assert pools.get("frontier").model_path == str(tmp_path)


@override_settings(CHAT_MAX_MODEL_LEN=1024)
def test_local_max_context_above_the_engine_context_is_refused():
    message = load_error([entry(max_context=1024, max_tokens=256), frontier(max_context=1025)])
    assert "'frontier'" in message and "'max_context'" in message and "1024" in message


@override_settings(CHAT_MAX_MODEL_LEN=1024)
def test_remote_max_context_is_not_bound_by_the_local_engine():
    pools = pools_load([entry(max_context=1024, max_tokens=256), frontier(max_context=1024), remote()])
    assert pools.get("remote-big").max_context == 32768


def test_max_tokens_must_leave_room_for_the_prompt():
    message = load_error([entry(max_context=2048, max_tokens=2048), frontier()])
    assert "'mini'" in message and "'max_tokens'" in message


@pytest.mark.parametrize(
    "price", ["price_input_per_m", "price_cached_input_per_m", "price_output_per_m"]
)
def test_negative_price_is_refused(price):
    message = load_error([entry(), frontier(**{price: "-0.01"})])
    assert "'frontier'" in message and price in message


def test_duplicate_name_and_version_is_refused():
    message = load_error([entry(), frontier(), frontier(priority=5)])
    assert "'frontier'" in message and "frontier@1" in message and "twice" in message


def test_same_name_with_another_version_is_allowed():
    pools = pools_load([entry(), frontier(), frontier(version="2")])
    assert pools.get("frontier", "2").version == "2"
    assert pools.default_version("frontier").version == "1"  # first listed


def test_unknown_tier_is_refused():
    message = load_error([entry(), frontier(tiers=["paid", "platinum"])])
    assert "'frontier'" in message and "'tiers'" in message and "platinum" in message


@override_settings(CHAT_TIER_DEFAULT_POOL={"free": "nano", "paid": "frontier", "enterprise": "frontier"})
def test_tier_default_pool_must_be_defined():
    message = load_error([entry(), frontier()])
    assert "CHAT_TIER_DEFAULT_POOL" in message and "'nano'" in message and "free" in message


@override_settings(CHAT_TIER_DEFAULT_POOL={"free": "frontier", "paid": "frontier", "enterprise": "frontier"})
def test_tier_default_pool_must_be_open_to_its_tier():
    message = load_error([entry(), frontier()])
    assert "'frontier'" in message and "'tiers'" in message and "'free'" in message


def test_empty_pool_set_is_refused():
    assert "no model pools" in load_error([])


def test_misspelt_field_is_refused_not_ignored():
    message = load_error([entry(max_token=100), frontier()])
    assert "'mini'" in message and "max_token" in message


def test_missing_required_field_is_named():
    bad = entry()
    del bad["max_context"]
    message = load_error([bad, frontier()])
    assert "'mini'" in message and "'max_context'" in message


def test_tiers_are_the_account_models_tiers():
    assert set(TIERS) == set(Tier.values)


# --- YAML files ---

YAML = """
pools:
  - name: mini
    version: "1"
    backend: local
    priority: 1
    max_context: 2048
    max_tokens: 512
    price_input_per_m: "0.75"
    price_cached_input_per_m: "0.075"
    price_output_per_m: "4.50"
    tiers: [free, paid, enterprise]
  - name: frontier
    version: "2024-06"
    backend: remote
    url: http://10.0.0.5:8000
    model: frontier-70b
    api_key: secret-key
    priority: 0
    max_context: 65536
    max_tokens: 4096
    price_input_per_m: 5
    price_cached_input_per_m: 0.5
    price_output_per_m: 30
    tiers: [paid, enterprise]
"""


def test_yaml_file_loads(tmp_path):
    path = tmp_path / "pools.yaml"
    path.write_text(YAML)
    pools = pools_load(path=str(path))
    front = pools.get("frontier")
    assert front.key == "frontier@2024-06"
    assert (front.backend, front.url, front.model) == ("remote", "http://10.0.0.5:8000", "frontier-70b")
    assert front.price_output_per_m == Decimal("30")
    assert "secret-key" not in repr(front)


def test_yaml_file_may_be_a_bare_list(tmp_path):
    path = tmp_path / "pools.yaml"
    path.write_text(YAML.replace("pools:\n", "").replace("\n  ", "\n"))
    assert pools_load(path=str(path)).names() == ["mini", "frontier"]


def test_invalid_yaml_names_the_file(tmp_path):
    path = tmp_path / "pools.yaml"
    path.write_text("pools: [name: mini\n")
    with pytest.raises(PoolConfigError, match="pools.yaml"):
        pools_load(path=str(path))


def test_yaml_error_names_the_file_and_pool(tmp_path):
    path = tmp_path / "pools.yaml"
    path.write_text(YAML.replace("url: http://10.0.0.5:8000", "url: ''"))
    with pytest.raises(PoolConfigError) as caught:
        pools_load(path=str(path))
    assert str(path) in str(caught.value) and "'frontier'" in str(caught.value)
    assert "'url'" in str(caught.value)


def test_pool_set_prefers_the_file_and_reloads_when_settings_change(tmp_path):
    path = tmp_path / "pools.yaml"
    path.write_text(YAML)
    assert pool_set().get("frontier").backend == "local"  # settings.CHAT_POOLS
    with override_settings(CHAT_POOLS_FILE=str(path)):
        assert pool_set().get("frontier").backend == "remote"
    assert pool_set().get("frontier").backend == "local"


def test_pool_set_is_cached_until_reset():
    first = pool_set()
    assert pool_set() is first
    pool_set_reset()
    assert pool_set() is not first


# --- lookup ---


@pytest.fixture
def pools() -> PoolSet:
    return pools_load([entry(), frontier(), frontier(version="2"), remote()])


def test_get_and_resolve_by_name_or_exact_version(pools):
    assert pools.resolve("frontier").key == "frontier@1"
    assert pools.resolve("frontier@2").key == "frontier@2"
    assert pools.get("frontier", "2") is pools.resolve("frontier@2")
    for ref in ("nano", "frontier@3", "frontier@"):
        with pytest.raises(KeyError):
            pools.resolve(ref)


def test_names_lists_each_name_once(pools):
    assert pools.names() == ["mini", "frontier", "remote-big"]


def test_for_tier_lists_default_versions_the_tier_may_use(pools):
    assert [p.key for p in pools.for_tier("free")] == ["mini@1"]
    assert [p.key for p in pools.for_tier("paid")] == ["mini@1", "frontier@1"]
    assert [p.key for p in pools.for_tier("enterprise")] == ["mini@1", "frontier@1", "remote-big@1"]


@override_settings(CHAT_FLAG_POOLS={"beta-frontier": "frontier"})
def test_a_feature_flag_opens_its_pool_beyond_the_tier(pools):
    assert [p.name for p in pools.for_tier("free", ["beta-frontier"])] == ["mini", "frontier"]
    assert [p.name for p in pools.for_tier("free", ["other-flag"])] == ["mini"]


# --- cost ---


def test_cost_charges_uncached_cached_and_completion_tokens_at_their_prices():
    mini = pools_load([entry(), frontier()]).get("mini")
    # 800 uncached * 0.75 + 200 cached * 0.075 + 100 completion * 4.50 = 1065 per 1M tokens
    assert mini.cost(prompt_tokens=1000, cached_tokens=200, completion_tokens=100) == Decimal("0.001065")


def test_cost_is_exact_decimal():
    front = pools_load([entry(), frontier()]).get("frontier")
    cost = front.cost(prompt_tokens=1, cached_tokens=0, completion_tokens=0)
    assert isinstance(cost, Decimal) and cost == Decimal("0.000005")
    assert front.cost(prompt_tokens=3, cached_tokens=3, completion_tokens=0) == Decimal("0.0000015")
    assert front.cost(prompt_tokens=0, cached_tokens=0, completion_tokens=0) == 0


def test_cost_refuses_more_cached_than_prompt_tokens():
    mini = pools_load([entry(), frontier()]).get("mini")
    with pytest.raises(ValueError, match="cached"):
        mini.cost(prompt_tokens=10, cached_tokens=11, completion_tokens=0)
    with pytest.raises(ValueError):
        mini.cost(prompt_tokens=10, cached_tokens=0, completion_tokens=-1)


# --- the start-up check ---


def test_system_check_passes_on_the_default_settings():
    assert check_model_pools() == []


@override_settings(CHAT_POOLS=[entry(), frontier(max_tokens=-5)])
def test_system_check_reports_a_bad_pool_naming_pool_and_field():
    errors = checks.run_checks(tags=["chat"])  # registered by AccountsConfig.ready
    assert [e.id for e in errors] == ["chat.E001"]
    assert "'frontier'" in errors[0].msg and "'max_tokens'" in errors[0].msg
    assert errors[0].is_serious()


@override_settings(
    CHAT_CANARIES=[{"pool": "frontier", "version": "9", "tier": "paid", "percent": 10}],
    CHAT_EXPERIMENTS=[{"name": "x", "arms": {"a": 1}, "pools": {"a": "nano"}}],
    CHAT_FLAG_POOLS={"beta": "gigantic"},
)
def test_system_check_reports_routing_settings_naming_undefined_pools():
    messages = [e.msg for e in checks.run_checks(tags=["chat"]) if e.id == "chat.E002"]
    assert len(messages) == 3
    assert any("CHAT_CANARIES[0]" in m and "frontier@9" in m for m in messages)
    assert any("CHAT_EXPERIMENTS[0]" in m and "nano" in m for m in messages)
    assert any("CHAT_FLAG_POOLS" in m and "gigantic" in m for m in messages)
