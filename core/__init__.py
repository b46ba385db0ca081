"""What every app uses, below them all: metrics (core/metrics.py), the Redis guard
(core/redis_guard.py), database and region routing (core/dbrouter.py, core/regions.py,
core/user_regions.py, and the region primaries' circuit breaker core/db_breaker.py), Server-Sent
Events framing (core/sse.py), the database thread for work that outlives a request
(core/db.py), and the ``/v1`` view plumbing (core/http.py: ``api_view``, ``ApiError``;
core/schemas.py: the request bodies' pydantic base).

This package and ``inference/`` import no feature app (a test checks it): what they need from
one is named in settings and resolved at use (the API-key lookup), or registered by the app in
its ``ready()`` (conversations/apps.py: what region routing asks about conversations).
"""
