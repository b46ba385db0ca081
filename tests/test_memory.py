"""Long-term user memory (issue 7): storage, retrieval, isolation, the /v1 API and the page.

Real PostgreSQL with pgvector and the real all-MiniLM-L6-v2 embedding model (no doubles).
"""

from __future__ import annotations

import pytest

from memory import selectors, services
from memory.models import UserMemory

pytestmark = pytest.mark.django_db

FIVE_FACTS = [
    "I am allergic to peanuts.",
    "My daughter plays the cello in a youth orchestra.",
    "I drive a 2012 Volvo estate.",
    "I am learning the Rust programming language.",
    "I prefer metric units in every answer.",
]


def test_relevant_fact_ranks_first(make_user):
    user = make_user()
    services.memory_add(user=user, texts=FIVE_FACTS)

    results = selectors.memory_search(user=user, query="Which snacks are safe for me to eat on the plane?")

    assert results[0][0].text == "I am allergic to peanuts."
