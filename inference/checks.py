"""System checks run by ``manage.py check`` and at server start (Django's check framework).

``chat.E001``: the model pool configuration (``CHAT_POOLS_FILE`` / ``CHAT_POOLS``,
``CHAT_TIER_DEFAULT_POOL``) is invalid; the message names the pool and the field
(inference/pools.py, ``pools_load``). ``chat.E002``: ``CHAT_CANARIES``, ``CHAT_EXPERIMENTS`` or
``CHAT_FLAG_POOLS`` names a pool that is not defined, or has a malformed entry
(inference/router.py, ``routing_config_errors``). ``chat.E003``: a ``CHAT_ENGINE_*`` speed setting
is invalid (inference/tuning.py, ``EngineTuning``). ``chat.W004``: the load-shedding thresholds
are out of the design's order (inference/router.py ``shed``). ``chat.E005``: a
``CHAT_ADMISSION_*`` setting of the adaptive admission cap is out of range (inference/limiter.py
``LimiterConfig``).

``InferenceConfig.ready`` (inference/apps.py) registers them with the tag ``chat``. They read no
database, so they run before migrations too. (the ASGI server does not run system checks: the ASGI entry point calls
``inference.pools.pool_set()`` at start for that.)
"""

from __future__ import annotations

from django.conf import settings
from django.core.checks import Error, Warning, register


@register("chat")
def check_model_pools(app_configs=None, **kwargs) -> list[Error]:
    """Load the pools as the server will; return one Error per problem (empty when valid)."""
    from inference.pools import PoolConfigError, pools_load  # noqa: PLC0415
    from inference.router import routing_config_errors  # noqa: PLC0415

    try:
        path = getattr(settings, "CHAT_POOLS_FILE", "")
        pools = pools_load(path=str(path)) if path else pools_load(list(settings.CHAT_POOLS))
    except PoolConfigError as exc:
        return [
            Error(
                str(exc),
                hint="Fix the pool entry (chatsite/settings/engine.py, 'Model pools', or the file "
                "CHAT_POOLS_FILE names).",
                id="chat.E001",
            )
        ]
    return [
        Error(message, id="chat.E002")
        for message in routing_config_errors(
            pools,
            canaries=list(getattr(settings, "CHAT_CANARIES", []) or []),
            experiments=list(getattr(settings, "CHAT_EXPERIMENTS", []) or []),
            flag_pools=dict(getattr(settings, "CHAT_FLAG_POOLS", {}) or {}),
        )
    ]


@register("chat")
def check_engine_tuning(app_configs=None, **kwargs) -> list[Error]:
    """``chat.E003``: a ``CHAT_ENGINE_*`` speed setting is invalid (inference/tuning.py,
    ``EngineTuning.from_settings``); the message names the variable and what it accepts."""
    from django.core.exceptions import ImproperlyConfigured  # noqa: PLC0415

    from inference.tuning import EngineTuning  # noqa: PLC0415

    try:
        EngineTuning.from_settings()
    except ImproperlyConfigured as exc:
        return [Error(str(exc), hint="See docs/engine-tuning.md.", id="chat.E003")]
    return []


@register("chat")
def check_shedding_order(app_configs=None, **kwargs) -> list[Warning]:
    """``chat.W004``: DESIGN.md's shedding order is free turns shed first, then paid turns
    degraded to the smaller pool, and reasoning turns queued last only as the last resort, so
    ``CHAT_SHED_FREE_WAITING`` < ``CHAT_DEGRADE_PAID_WAITING`` < ``CHAT_REASONING_LAST_WAITING``
    (requests waiting for an engine slot); thresholds out of that order are warned about (a
    warning, not an error: one threshold set very high to switch that step off is a choice)."""
    free = settings.CHAT_SHED_FREE_WAITING
    paid = settings.CHAT_DEGRADE_PAID_WAITING
    reasoning = settings.CHAT_REASONING_LAST_WAITING
    if free < paid < reasoning:
        return []
    return [
        Warning(
            f"Load-shedding thresholds out of order: CHAT_SHED_FREE_WAITING={free}, "
            f"CHAT_DEGRADE_PAID_WAITING={paid}, CHAT_REASONING_LAST_WAITING={reasoning}; each "
            "must be below the next (free shed first, then paid degraded, reasoning queued last).",
            hint="See docs/tiers-and-limits.md.",
            id="chat.W004",
        )
    ]


@register("chat")
def check_admission_limiter(app_configs=None, **kwargs) -> list[Error]:
    """``chat.E005``: the adaptive admission cap's settings (``CHAT_ADMISSION_TPOT_TARGET_MS``,
    ``_MIN_LIMIT``, ``_BACKOFF``, ``_WINDOW_S``, ``_MIN_SAMPLES``) are out of range; the message
    names them and what they accept (inference/limiter.py ``LimiterConfig``)."""
    from inference.limiter import LimiterConfig  # noqa: PLC0415

    try:
        LimiterConfig.from_settings()
    except (TypeError, ValueError) as exc:
        return [Error(str(exc), hint="See docs/tiers-and-limits.md.", id="chat.E005")]
    return []
