"""The feedback counter, on the process's default ``prometheus_client`` registry, so ``/metrics``
(chatsite/health.py ``metrics_view``) exports it with the rest of core/metrics.py.

- ``chat_feedback_total{pool,model_version,rating}``: ratings given, counted when a user rates
  an answer or changes their rating of it (``rating`` = ``up`` | ``down``: the new rating);
  sending the same rating again, or only editing the comment, counts nothing. ``pool`` and
  ``model_version`` are the answer's (``Turn.pool``, ``Turn.model_version``; ``unknown`` for
  answers stored before turns recorded them). Prometheus sums the processes' counters; the
  admin's per-pool counts (feedback.selectors.feedback_counts) are the stored state.

Imported by ``FeedbackConfig.ready`` so every process exports the metric from its start.
"""

from __future__ import annotations

from prometheus_client import Counter

FEEDBACK = Counter(
    "chat_feedback",
    "Answer ratings given or changed, by the answer's pool and model version and the new rating "
    "(up, down).",
    ["pool", "model_version", "rating"],
)


def feedback_count(*, pool: str, model_version: str, rating: str) -> None:
    """Count one rating given (or changed to ``rating``) for an answer of ``pool`` at
    ``model_version``; blank names are counted as ``unknown``."""
    FEEDBACK.labels(
        pool=pool or "unknown", model_version=model_version or "unknown", rating=rating
    ).inc()
