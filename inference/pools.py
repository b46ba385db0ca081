"""Model pools: which model answers, on which engine, at what priority, ceilings and price.

A *pool* is a named, versioned way of serving a model (``mini``, ``frontier``, ``reasoning``):
its backend (``local``: an in-process vLLM engine for a model folder; ``remote``: an
OpenAI-compatible vLLM server), the served model name, its scheduling priority (vLLM: lower runs
first), its context and answer ceilings in tokens, an optional system preamble, its prices in USD
per 1M tokens and the tiers that may use it.

Pools come from ``settings.CHAT_POOLS_FILE`` (a YAML list) when set, else ``settings.CHAT_POOLS``
(a list of dicts); both have the same fields (``chatsite/settings/engine.py``, "Model pools").
:func:`pools_load` validates them (pydantic for field types, then rules across fields and pools)
and raises :class:`PoolConfigError` naming the pool and the field; the system check in
``inference/checks.py`` runs it at start, so ``manage.py check`` and the server refuse a bad file.

Several pools may share one engine: every local pool on ``settings.CHAT_MODEL_PATH`` is served by
the process's engine (``inference.engine.get_engine()``); :func:`pool_engine` builds one more
engine per other model folder, one remote client per (URL, model), and for a remote pool of
several nodes (``urls``) one node set (inference/nodes.py: node choice, readiness, retry on
another node).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any, Literal

import yaml
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.module_loading import import_string
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from inference.nodes import NodeSet
from inference.remote import OpenAIRemoteEngine

# The user tiers (accounts.models.Tier's values; a test checks they agree). Kept here so this
# module imports without the app registry.
TIERS: tuple[str, ...] = ("free", "paid", "enterprise")

_PER_MILLION = Decimal(1_000_000)
# Costs are stored with 8 decimal places (usage.UsageRecord.cost_usd, Turn.cost_usd).
COST_QUANTUM = Decimal("0.00000001")


@dataclass(frozen=True)
class Pool:
    """One validated pool (see the module docstring). Token counts are tokens; prices USD per 1M.

    ``model`` is the served model name (a remote pool sends it as ``model``; a local pool's is
    ``settings.CHAT_MODEL_NAME`` unless given). ``model_path`` is the model folder of a local pool
    and the tokenizer folder of a remote one (prompts are built locally with its chat template).
    ``max_context`` is prompt + answer; ``max_tokens`` the most completion tokens of one answer.
    ``urls`` are the base URLs of a remote pool's nodes (one or more, inference/nodes.py);
    ``url`` is the first of them (empty for a local pool).
    """

    name: str
    label: str
    version: str
    backend: str  # "local" | "remote"
    model: str
    model_path: str
    url: str
    api_key: str = field(repr=False)  # never in logs or reprs
    priority: int
    max_context: int
    max_tokens: int
    system_preamble: str
    price_input_per_m: Decimal
    price_cached_input_per_m: Decimal
    price_output_per_m: Decimal
    tiers: tuple[str, ...]
    urls: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        """``"name@version"``: the exact pool, as org pins and turn records name it."""
        return f"{self.name}@{self.version}"

    def cost(self, *, prompt_tokens: int, cached_tokens: int, completion_tokens: int) -> Decimal:
        """Cost in USD of one request, exact (no rounding):
        ``((prompt - cached) * input + cached * cached_input + completion * output) / 1M``.

        ``cached_tokens`` are the prompt tokens served from the prefix cache (part of
        ``prompt_tokens``, billed at the cached-input price). Raises ValueError on negative counts
        or more cached than prompt tokens.
        """
        if min(prompt_tokens, cached_tokens, completion_tokens) < 0:
            raise ValueError("token counts must not be negative")
        if cached_tokens > prompt_tokens:
            raise ValueError(
                f"cached tokens ({cached_tokens}) exceed prompt tokens ({prompt_tokens})"
            )
        total = (
            (prompt_tokens - cached_tokens) * self.price_input_per_m
            + cached_tokens * self.price_cached_input_per_m
            + completion_tokens * self.price_output_per_m
        )
        return total / _PER_MILLION

    def charge(self, *, prompt_tokens: int, cached_tokens: int, completion_tokens: int) -> Decimal:
        """The cost in USD as it is charged and stored: :meth:`cost` rounded half up to 8
        decimal places (COST_QUANTUM), so the turn, the ``done`` event and the usage ledger agree
        to the last digit. The one cost function every path uses. The counts come from a
        token tally whose cached tokens are already within the prompt (inference/serving.py
        clamps what an engine reports); raises ValueError otherwise."""
        return self.cost(
            prompt_tokens=prompt_tokens, cached_tokens=cached_tokens, completion_tokens=completion_tokens
        ).quantize(COST_QUANTUM, rounding=ROUND_HALF_UP)


class PoolConfigError(ImproperlyConfigured):
    """The pool configuration is invalid; the message names the pool and the field."""


class _PoolSpec(BaseModel):
    """The fields of one pool entry as written in settings or YAML (types and ranges only)."""

    model_config = ConfigDict(extra="forbid", strict=False)

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    label: str = ""
    version: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    backend: Literal["local", "remote"]
    model: str = ""
    model_path: str = ""
    url: str = ""
    urls: list[str] | None = None
    api_key: str = ""
    priority: int = 0
    max_context: int = Field(gt=0)
    max_tokens: int = Field(gt=0)
    system_preamble: str = ""
    price_input_per_m: Decimal = Field(ge=0)
    price_cached_input_per_m: Decimal = Field(ge=0)
    price_output_per_m: Decimal = Field(ge=0)
    tiers: list[str] = Field(min_length=1)


class PoolSet:
    """The configured pools, in the order listed. The first-listed version of a name is its
    default version (what ``"frontier"`` without a version means)."""

    def __init__(self, pools: Iterable[Pool]):
        self.pools: tuple[Pool, ...] = tuple(pools)
        self._by_key = {p.key: p for p in self.pools}
        self._default: dict[str, Pool] = {}
        for p in self.pools:
            self._default.setdefault(p.name, p)

    def __iter__(self):
        return iter(self.pools)

    def __len__(self) -> int:
        return len(self.pools)

    def get(self, name: str, version: str | None = None) -> Pool:
        """The pool ``name`` at ``version`` (None: its default version). Raises KeyError."""
        if version is None:
            return self.default_version(name)
        return self._by_key[f"{name}@{version}"]

    def resolve(self, ref: str) -> Pool:
        """``"name"`` (default version) or ``"name@version"`` -> Pool. Raises KeyError."""
        name, sep, version = ref.partition("@")
        return self.get(name, version if sep else None)

    def default_version(self, name: str) -> Pool:
        """The first-listed version of pool ``name``. Raises KeyError."""
        return self._default[name]

    def names(self) -> list[str]:
        """Pool names (not versions), in the order first listed."""
        return list(self._default)

    def allows(self, pool: Pool, tier: str, flags: Iterable[str] = ()) -> bool:
        """May a user of ``tier`` with feature ``flags`` use ``pool``? Yes if the pool lists the
        tier, or a flag opens it (``settings.CHAT_FLAG_POOLS``: flag -> pool name or key)."""
        if tier in pool.tiers:
            return True
        flag_pools = getattr(settings, "CHAT_FLAG_POOLS", {}) or {}
        return any(flag_pools.get(flag) in (pool.name, pool.key) for flag in flags)

    def for_tier(self, tier: str, flags: Iterable[str] = ()) -> list[Pool]:
        """Default versions of the pools ``tier`` (or one of ``flags``) may use, in listed order."""
        flags = tuple(flags)
        return [p for p in self._default.values() if self.allows(p, tier, flags)]


def _spec_error(index: int, raw: Any, exc: ValidationError, source: str) -> PoolConfigError:
    name = raw.get("name") if isinstance(raw, dict) else None
    parts = []
    for err in exc.errors():
        field = ".".join(str(x) for x in err["loc"]) or "(entry)"
        parts.append(f"field {field!r}: {err['msg']}")
    return PoolConfigError(f"model pool {name or '#' + str(index)!r} ({source}[{index}]): " + "; ".join(parts))


def _build(index: int, raw: Any, source: str) -> Pool:
    if not isinstance(raw, dict):
        raise PoolConfigError(f"model pool #{index} ({source}[{index}]): must be a mapping of fields, got {type(raw).__name__}")
    try:
        spec = _PoolSpec.model_validate(raw)
    except ValidationError as exc:
        raise _spec_error(index, raw, exc, source) from None

    def fail(field: str, why: str) -> PoolConfigError:
        return PoolConfigError(f"model pool {spec.name!r} ({source}[{index}]): field {field!r}: {why}")

    model_path = spec.model_path or str(settings.CHAT_MODEL_PATH)
    urls: list[str] = []
    if spec.backend == "remote":
        urls = _node_urls(spec, fail)
        if not spec.model:
            raise fail("model", "a remote pool needs the model name its server serves")
        if not Path(model_path).is_dir():
            raise fail("model_path", f"tokenizer folder {model_path!r} does not exist")
    else:
        if spec.url:
            raise fail("url", "a local pool has no URL (use backend: remote)")
        if spec.urls is not None:
            raise fail("urls", "a local pool has no URLs (use backend: remote)")
        if not Path(model_path).is_dir():
            raise fail("model_path", f"model folder {model_path!r} does not exist")
        if spec.max_context > settings.CHAT_MAX_MODEL_LEN:
            raise fail(
                "max_context",
                f"{spec.max_context} tokens is more than the engine's context "
                f"(CHAT_MAX_MODEL_LEN = {settings.CHAT_MAX_MODEL_LEN})",
            )
    if spec.max_tokens >= spec.max_context:
        raise fail(
            "max_tokens",
            f"{spec.max_tokens} must be less than max_context ({spec.max_context}): "
            "the prompt needs room too",
        )
    unknown = [t for t in spec.tiers if t not in TIERS]
    if unknown:
        raise fail("tiers", f"unknown tier {unknown[0]!r} (tiers: {', '.join(TIERS)})")
    return Pool(
        name=spec.name,
        label=spec.label or spec.name,
        version=spec.version,
        backend=spec.backend,
        model=spec.model or (settings.CHAT_MODEL_NAME if spec.backend == "local" else ""),
        model_path=model_path,
        url=urls[0] if urls else "",
        api_key=spec.api_key,
        priority=spec.priority,
        max_context=spec.max_context,
        max_tokens=spec.max_tokens,
        system_preamble=spec.system_preamble,
        price_input_per_m=spec.price_input_per_m,
        price_cached_input_per_m=spec.price_cached_input_per_m,
        price_output_per_m=spec.price_output_per_m,
        tiers=tuple(dict.fromkeys(spec.tiers)),
        urls=tuple(urls),
    )


def _node_urls(spec: _PoolSpec, fail) -> list[str]:
    """A remote pool's node URLs: ``urls`` (several nodes, inference/nodes.py) or ``url`` (one),
    each an http(s) base URL without a trailing slash, no two alike. ``fail(field, why)`` makes
    the PoolConfigError naming the pool and field."""
    if spec.url and spec.urls is not None:
        raise fail("urls", "give url (one node) or urls (several), not both")
    if spec.urls is not None:
        field_name, given = "urls", spec.urls
        if not given:
            raise fail("urls", "lists no node; give at least one base URL")
    elif spec.url:
        field_name, given = "url", [spec.url]
    else:
        raise fail(
            "url",
            "a remote pool needs the base URL of its OpenAI-compatible server "
            "(url, or urls for several nodes)",
        )
    urls: list[str] = []
    for index, url in enumerate(given):
        where = field_name if field_name == "url" else f"urls[{index}]"
        if not url.startswith(("http://", "https://")):
            raise fail(where, f"{url!r} is not an http(s) URL")
        url = url.rstrip("/")
        if url in urls:
            raise fail(where, f"{url!r} is listed twice")
        urls.append(url)
    return urls


def pools_load(raw: list[dict] | None = None, path: str | None = None) -> PoolSet:
    """Validate pool entries and return the PoolSet.

    Give ``raw`` (a list of dicts, as ``settings.CHAT_POOLS``) or ``path`` (a YAML file holding
    such a list, or a mapping with a ``pools:`` list). Besides each field's type and range:
    a remote pool needs ``url`` (or ``urls``: several nodes, distinct http(s) URLs) and
    ``model``; a local pool's model folder must exist and its ``max_context`` fit ``settings.CHAT_MAX_MODEL_LEN``; ``max_tokens < max_context``; prices
    >= 0; ``name@version`` unique; tiers known; each tier's default pool
    (``settings.CHAT_TIER_DEFAULT_POOL``) defined and open to that tier; at least one pool.
    Raises PoolConfigError (an ImproperlyConfigured) naming the pool and field.
    """
    if (raw is None) == (path is None):
        raise TypeError("give exactly one of raw or path")
    source = "CHAT_POOLS"
    if path is not None:
        source = str(path)
        try:
            with open(path, encoding="utf-8") as f:
                loaded = yaml.safe_load(f)
        except OSError as exc:
            raise PoolConfigError(f"pool file {path!r} cannot be read: {exc}") from exc
        except yaml.YAMLError as exc:
            raise PoolConfigError(f"pool file {path!r} is not valid YAML: {exc}") from exc
        if isinstance(loaded, dict) and "pools" in loaded:
            loaded = loaded["pools"]
        if loaded is None:
            loaded = []
        if not isinstance(loaded, list):
            raise PoolConfigError(f"pool file {path!r} must hold a list of pools (or pools: [...])")
        raw = loaded
    if not isinstance(raw, (list, tuple)):
        raise PoolConfigError(f"{source} must be a list of pools")
    if not raw:
        raise PoolConfigError(f"{source} defines no model pools; at least one is needed")
    pools: list[Pool] = []
    seen: set[str] = set()
    for index, entry in enumerate(raw):
        pool = _build(index, entry, source)
        if pool.key in seen:
            raise PoolConfigError(
                f"model pool {pool.name!r} ({source}[{index}]): field 'version': "
                f"{pool.key} is defined twice"
            )
        seen.add(pool.key)
        pools.append(pool)
    pool_set_ = PoolSet(pools)
    defaults = getattr(settings, "CHAT_TIER_DEFAULT_POOL", {}) or {}
    for tier in TIERS:
        name = defaults.get(tier)
        if not name:
            raise PoolConfigError(f"CHAT_TIER_DEFAULT_POOL names no pool for tier {tier!r}")
        try:
            pool = pool_set_.resolve(name)
        except KeyError:
            raise PoolConfigError(
                f"CHAT_TIER_DEFAULT_POOL[{tier!r}] is {name!r}, which is not a defined pool "
                f"(pools: {', '.join(pool_set_.names())})"
            ) from None
        if tier not in pool.tiers:
            raise PoolConfigError(
                f"model pool {pool.name!r}: field 'tiers': it is the default pool of tier "
                f"{tier!r} (CHAT_TIER_DEFAULT_POOL) but does not list that tier"
            )
    return pool_set_


_pool_set: PoolSet | None = None
_engines: dict[tuple[str, ...], Any] = {}
_lock = threading.RLock()


def pool_set() -> PoolSet:
    """The process's pools, loaded once from ``settings.CHAT_POOLS_FILE`` (if set) else
    ``settings.CHAT_POOLS``. Raises PoolConfigError. Changing those settings (override_settings)
    or calling :func:`pool_set_reset` loads them again."""
    global _pool_set
    with _lock:
        if _pool_set is None:
            path = getattr(settings, "CHAT_POOLS_FILE", "")
            if path:
                _pool_set = pools_load(path=str(path))
            else:
                _pool_set = pools_load(list(settings.CHAT_POOLS))
        return _pool_set


def pool_set_reset() -> None:
    """Forget the loaded pools and the per-pool engines built for them (tests; the process's
    own engine, ``get_engine()``, is not touched)."""
    global _pool_set
    with _lock:
        _pool_set = None
        for engine in _engines.values():
            stop = getattr(engine, "stop_watching", None)  # a pool of several nodes' checks
            if stop is not None:
                stop()
        _engines.clear()


_POOL_SETTINGS = {
    "CHAT_POOLS",
    "CHAT_POOLS_FILE",
    "CHAT_TIER_DEFAULT_POOL",
    "CHAT_MODEL_PATH",
    "CHAT_MODEL_NAME",
    "CHAT_MAX_MODEL_LEN",
    "CHAT_ENGINE_CLASS",
}


@receiver(setting_changed)
def _pools_setting_changed(*, setting: str, **kwargs) -> None:
    if setting in _POOL_SETTINGS:
        pool_set_reset()


def _same_folder(a: str, b: str) -> bool:
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return a == b


def _local_engine_for(model_path: str):
    """An engine of ``settings.CHAT_ENGINE_CLASS`` for another model folder: the class's
    ``for_model_path(path)`` if it has one, else ``from_settings()`` with ``model_path``
    replaced (a dataclass such as VllmEngine), else a plain ``from_settings()`` (test doubles)."""
    cls = import_string(settings.CHAT_ENGINE_CLASS)
    builder = getattr(cls, "for_model_path", None)
    if builder is not None:
        return builder(model_path)
    engine = cls.from_settings()
    if dataclasses.is_dataclass(engine) and any(
        f.name == "model_path" for f in dataclasses.fields(engine)
    ):
        engine = dataclasses.replace(engine, model_path=model_path)
    return engine


def pool_engine(pool: Pool):
    """The engine (``inference.engine.EngineProtocol``) that serves ``pool``.

    - local pool on ``settings.CHAT_MODEL_PATH``: the process's engine, ``get_engine()`` (so the
      test double installed there serves it too);
    - local pool on another folder: one engine per folder, built from
      ``settings.CHAT_ENGINE_CLASS`` (started lazily like the main one);
    - remote pool of one node: one ``inference.remote.OpenAIRemoteEngine`` per (url, model);
    - remote pool of several nodes (``urls``): one ``inference.nodes.NodeSet`` per (urls,
      model): node choice by conversation, readiness, and retry on another node.

    Engines are created, not started: callers ``await engine.ensure_started()`` as usual.
    """
    from inference.engine import get_engine  # noqa: PLC0415 - engine imports settings at use

    if pool.backend == "local":
        if _same_folder(pool.model_path, str(settings.CHAT_MODEL_PATH)):
            return get_engine()
        key = ("local", str(Path(pool.model_path).resolve()))
    else:
        key = ("remote", *pool.urls, pool.model, pool.api_key)
    with _lock:
        engine = _engines.get(key)
        if engine is None:
            if pool.backend == "local":
                engine = _local_engine_for(pool.model_path)
            else:
                engine = NodeSet.for_pool(pool) if len(pool.urls) > 1 else OpenAIRemoteEngine.for_pool(pool)
            _engines[key] = engine
        return engine


def node_sets() -> dict[str, NodeSet]:
    """Pool key (``name@version``) -> its NodeSet, for every configured pool of several nodes
    (built if not yet; not started). Raises PoolConfigError as ``pool_set`` does."""
    return {pool.key: pool_engine(pool) for pool in pool_set() if len(pool.urls) > 1}
