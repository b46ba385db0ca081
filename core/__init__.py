"""What every app uses, below them all: the Redis guard (core/redis_guard.py), Server-Sent
Events framing (core/sse.py), the database thread for work that outlives a request
(core/db.py), and the ``/v1`` view plumbing (core/http.py: ``api_view``, ``ApiError``;
core/schemas.py: the request bodies' pydantic base).

This package and ``inference/`` import no feature app (a test checks it): what they need from
one (the API-key lookup) is named in settings and resolved at use.
"""
