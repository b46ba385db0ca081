"""What an imported chat becomes before it is written (imports/services.py): :class:`Chat` of
:class:`Message` rows with this product's turn-tree links, the raw :class:`Node` of a source's
message tree, :class:`ImportFormatError`, and the readers' shared field checks. The formats
themselves are read by imports/formats.py (ChatGPT, Open WebUI) and imports/own_format.py (this
product's export)."""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field

USER, ASSISTANT, TOOL = "user", "assistant", "tool"


class ImportFormatError(ValueError):
    """The file is not an export this reader knows, or part of it is malformed (the message
    names the part)."""


@dataclass
class Message:
    """One message with this product's links (imports/formats.py's module docstring); keys are the
    source's ids."""

    key: str
    role: str  # "user" | "assistant" | "tool" (this product's own export only)
    content: str
    created_at: dt.datetime
    parent: str | None = None  # user messages
    reply_to: str | None = None  # answers: the question; tool results: the calling answer
    replaces: str | None = None
    model: str = ""
    status: str = "complete"
    continues: str | None = None  # answers: the cut-off or calling answer this one follows
    tool_calls: list[dict] = field(default_factory=list)  # answers that called functions
    tool_call_id: str = ""  # tool results
    finish_reason: str = ""  # "": what the importer infers from the status


@dataclass
class Chat:
    """One conversation to import: ``source`` (``chatgpt`` | ``openwebui`` | ``chatsite``) and
    its id there, title, times, model, system prompt, messages (oldest first), and the branch to
    show: ``current`` (the key of the newest message on it; None: the newest branch).
    ``skipped``: messages left out (imports/formats.py); ``stand_ins``: calling answers put in
    for tool results whose own calling answer the file lacks (imports/own_format.py
    ``stand_in_calls``); ``added_calls``: calls put in a calling answer for the results that
    name it but whose call it did not list (``unlisted_calls_add``)."""

    source: str
    source_id: str
    title: str
    created_at: dt.datetime
    updated_at: dt.datetime
    messages: list[Message]
    model: str = ""
    system_prompt: str = ""
    current: str | None = None
    skipped: int = 0
    answer_choices: dict[str, str] = field(default_factory=dict)  # question key -> answer key
    stand_ins: int = 0  # calling answers put in for results whose own was not in the file
    added_calls: int = 0  # calls put in a calling answer for results it did not list


@dataclass
class Node:
    """A message of a source's tree before linking: ``parent`` is the node before it."""

    key: str
    parent: str | None
    role: str
    content: str
    created_at: dt.datetime | None
    model: str = ""


# How far after now a time may be (clocks differ); a later one would sort above every chat.
FUTURE_SLACK = dt.timedelta(days=1)
# Unpaired UTF-16 surrogates (JSON's "\ud800" escapes): UTF-8, so PostgreSQL, cannot hold them.
_SURROGATE = re.compile("[\ud800-\udfff]")


def read_time(value, where: str) -> dt.datetime | None:
    """A Unix time (seconds, int or float; milliseconds when it is too large to be seconds) or
    an ISO 8601 text -> an aware UTC datetime; None for None. Raises ImportFormatError naming
    ``where`` for anything else, a time outside years 1-9999 in UTC (PostgreSQL would store it
    but it could not be read back) or more than :data:`FUTURE_SLACK` after now."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ImportFormatError(f"{where}: not a time: {value!r}")
    if isinstance(value, int | float):
        seconds = value / 1000 if value > 10_000_000_000 else value
        try:
            moment = dt.datetime.fromtimestamp(seconds, tz=dt.UTC)
        except (OverflowError, OSError, ValueError):
            raise ImportFormatError(f"{where}: not a time: {value!r}") from None
    elif isinstance(value, str):
        try:
            moment = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
            moment = moment.astimezone(dt.UTC) if moment.tzinfo else moment.replace(tzinfo=dt.UTC)
        except (OverflowError, ValueError):
            raise ImportFormatError(f"{where}: not a time: {value!r}") from None
    else:
        raise ImportFormatError(f"{where}: not a time: {value!r}")
    if moment > dt.datetime.now(dt.UTC) + FUTURE_SLACK:
        raise ImportFormatError(f"{where}: {value!r} is in the future")
    return moment


def read_object(value, where: str) -> dict:
    """``value`` if it is a JSON object; raises ImportFormatError naming ``where``."""
    if not isinstance(value, dict):
        raise ImportFormatError(f"{where}: expected an object, found {type(value).__name__}")
    return value


def read_text(value, where: str) -> str:
    """``value`` as text (None: ""), NUL characters removed and unpaired surrogates made U+FFFD
    (PostgreSQL text can hold neither); raises ImportFormatError naming ``where`` for anything
    else."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ImportFormatError(f"{where}: expected text, found {type(value).__name__}")
    return _SURROGATE.sub("\ufffd", value.replace("\x00", ""))


def read_label(value) -> str:
    """A name the file gives as any JSON value (a model's, a role): its text, or "" for a false
    value, made storable as :func:`read_text` makes text."""
    return read_text(str(value or ""), "")


def cycle_check(parents: dict[str, str | None], where: str) -> None:
    """Raise ImportFormatError naming ``where`` when following ``parents`` (key -> the key
    before it; a parent that is no key ends the walk) from some key comes back round, since
    every walk up such a tree would never end. Each key is walked past once (linear time)."""
    done: set[str] = set()
    for start in parents:
        path, at = set(), start
        while at is not None and at in parents and at not in done:
            if at in path:
                raise ImportFormatError(f"{where}: the messages' parents form a cycle at {at!r}")
            path.add(at)
            at = parents[at]
        done |= path
