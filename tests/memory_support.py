"""Facts and a question shared by the memory tests (tests/test_memory*.py): five facts of one
person, a question only one of them answers, and the texts of a search's results."""

from __future__ import annotations

FIVE_FACTS = [
    "I am allergic to peanuts.",
    "My daughter plays the cello in a youth orchestra.",
    "I drive a 2012 Volvo estate.",
    "I am learning the Rust programming language.",
    "I prefer metric units in every answer.",
]
PEANUT_QUESTION = "Which snacks are safe for me to eat on the plane?"


def texts_of(results) -> list[str]:
    return [fact.text for fact, _similarity in results]
