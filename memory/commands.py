"""Explicit memory requests in a user's message: "remember that I ...", "forget that ...",
"call me ..." (issue 28 part 3). Parsed deterministically (pure functions, no Django); applied
at once when the message is submitted (memory/updates.py ``memory_commands_apply``), not after
the conversation goes idle.

A command is recognised only at the start of a sentence of the message ("Please remember that
I'm vegetarian.", "Oh, and call me Sam."); a request inside quoted text or after a translate /
summarise request is not one (memory.statements ``masked``). Each carries the span of the
message it came from, so what it stores is grounded like any extracted fact.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from memory.statements import _LEAD, _SENTENCE, _TRAIL, _s, _statement_of, _third, fact_words, masked

_FLAGS = re.IGNORECASE
_POLITE = r"(?:(?:please|pls|also|and|oh|ok|okay|hey|actually|btw|well|so|now|wait)[,\s]+)*(?:(?:can|could|would|will) you\s+)?(?:please\s+)?"
_REMEMBER = re.compile(rf"^{_POLITE}(?:remember|keep in mind|note|don't forget)(?:\s+that|:|,)?\s+(.+)", _FLAGS)
_FORGET = re.compile(rf"^{_POLITE}(?:forget|stop remembering|delete the memory)(?:\s+that|\s+about|:|,)?\s+(.+)", _FLAGS)
_CALL_ME = re.compile(rf"^{_POLITE}(?:from now on,?\s+)?(?:call me|address me as|you can call me)\s+([A-Z][\w'-]+)", re.IGNORECASE)
_EVERYTHING = re.compile(r"^(?:everything|all)(?: (?:about me|you know about me|you remember))?$", _FLAGS)
_NAME = re.compile(r"^(?:my name|what i'?m called|what to call me|my nickname)$", _FLAGS)
_FIRST_PERSON = frozenset({"i", "i'm", "im", "am", "my", "me", "mine", "myself", "that", "about", "was", "were", "m", "ve", "re", "ll", "d"})


@dataclass(frozen=True)
class Command:
    """One request: ``kind`` ("remember", "forget" or "call_me"), ``clause`` (what follows the
    verb, as written), ``start``/``end`` (the clause's character offsets in the message)."""

    kind: str
    clause: str
    start: int
    end: int


def commands_parse(text: str) -> list[Command]:
    """The memory commands in ``text`` (a user message), in order; [] when there are none."""
    view = masked(text)
    found = []
    for sentence in _SENTENCE.finditer(view):
        body = sentence.group()
        offset = sentence.start() + len(body) - len(body.lstrip())
        body = body.strip()
        if not body:  # a question may ask too: "Can you remember that ...?"
            continue
        for kind, pattern in (("call_me", _CALL_ME), ("forget", _FORGET), ("remember", _REMEMBER)):
            match = pattern.match(body)
            if match is None:
                continue
            start = offset + match.start(1)
            clause = _TRAIL.sub("", text[start : offset + match.end(1)]).strip()
            if clause:
                found.append(Command(kind, clause, start, start + len(clause)))
            break
    return found


def remembered_fact(clause: str) -> tuple[str, str]:
    """(fact text, slot) for what a "remember that ..." clause says: the extractor's reading
    when it knows the statement (memory.statements), else the clause in the third person
    ("I have a meeting on Friday" -> "The user has a meeting on Friday."); a clause not about
    the user is kept as said ("Remember: the wifi code is 1234.")."""
    found = _statement_of(clause)
    if found is not None:
        return found
    body = clause[_LEAD.match(clause).end():] if _LEAD.match(clause) else clause
    body = _TRAIL.sub("", body.strip())
    match = re.match(r"^(?:i'm|i am)\s+(.+)", body, _FLAGS)
    if match:
        return f"The user is {_third(match.group(1))}.", ""
    match = re.match(r"^i\s+(\w+)\s*(.*)", body, _FLAGS)
    if match:
        return f"The user {_s(match.group(1).lower())} {_third(match.group(2))}".strip() + ".", ""
    match = re.match(r"^my\s+(.+)", body, _FLAGS)
    if match:
        return f"The user's {_third(match.group(1))}.", ""
    return f"Remember: {body}.", ""


def forget_words(clause: str) -> set[str] | None:
    """The content words a fact must all contain to be forgotten by "forget that <clause>";
    None for "forget everything"; the marker {"<name>"} for "forget my name"."""
    body = _TRAIL.sub("", clause.strip())
    if _EVERYTHING.match(body):
        return None
    if _NAME.match(body):
        return {"<name>"}
    return fact_words(body) - _FIRST_PERSON
