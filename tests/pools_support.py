"""Model pool entries for tests (a valid local pool, the frontier pool, a remote pool; fields
override), the error a bad configuration raises, and a fixture that resets the process's pool
set around a test (autouse where imported)."""

from __future__ import annotations

import pytest

from inference.pools import PoolConfigError, pool_set_reset, pools_load


def entry(name: str = "mini", **fields) -> dict:
    """A valid local pool entry; ``fields`` override."""
    base = {
        "name": name,
        "version": "1",
        "backend": "local",
        "priority": 1,
        "max_context": 2048,
        "max_tokens": 512,
        "price_input_per_m": "0.75",
        "price_cached_input_per_m": "0.075",
        "price_output_per_m": "4.50",
        "tiers": ["free", "paid", "enterprise"],
    }
    return {**base, **fields}


def frontier(**fields) -> dict:
    return entry(**{
        "name": "frontier",
        "priority": 0,
        "price_input_per_m": "5.00",
        "price_cached_input_per_m": "0.50",
        "price_output_per_m": "30.00",
        "tiers": ["paid", "enterprise"],
        **fields,
    })  # fmt: skip


def remote(**fields) -> dict:
    return entry(**{
        "name": "remote-big",
        "backend": "remote",
        "url": "http://127.0.0.1:9/",
        "model": "big-model",
        "max_context": 32768,
        "max_tokens": 4096,
        "tiers": ["enterprise"],
        **fields,
    })  # fmt: skip


def load_error(raw) -> str:
    with pytest.raises(PoolConfigError) as caught:
        pools_load(raw)
    return str(caught.value)


@pytest.fixture(autouse=True)
def _fresh_pools():
    pool_set_reset()
    yield
    pool_set_reset()
