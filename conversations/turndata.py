"""A :class:`~conversations.models.Turn` as JSON-safe data, derived from the model's fields.

One place spells how a turn becomes data and back, so adding a field to Turn needs no edit
anywhere else: the hot cache's entries (conversations/cache.py), the held-answer records of
the write-back (conversations/writeback.py) and the personal-data export (privacy/
export_sections.py) all go through here.

``turn_data`` keys are the concrete fields' attribute names (``conversation_id``,
``reply_to_id``, ...). Values are JSON-safe: UUIDs and Decimals as strings (a Decimal as its
exact string: ``cost_usd``), datetimes as ISO 8601 with their UTC offset, the rest as stored.
"""

from __future__ import annotations

import json
from datetime import datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

from conversations.models import Turn

TURN_FIELDS = tuple(Turn._meta.concrete_fields)


def turn_values(turn: Turn) -> dict[str, Any]:
    """Every concrete field of ``turn`` by attribute name, as Python values (UUID, datetime,
    Decimal: for an encoder that knows them, like DjangoJSONEncoder)."""
    return {f.attname: getattr(turn, f.attname) for f in TURN_FIELDS}


def turn_data(turn: Turn) -> dict[str, Any]:
    """:func:`turn_values` made JSON-safe (see the module docstring)."""
    data = {}
    for f in TURN_FIELDS:
        value = getattr(turn, f.attname)
        if isinstance(value, (UUID, Decimal)):
            value = str(value)
        elif isinstance(value, datetime):
            value = value.isoformat()
        data[f.attname] = value
    return data


def turn_from_data(data: dict[str, Any]) -> Turn:
    """The unsaved :class:`Turn` that ``turn_data`` (or an older version of it) describes:
    fields it lacks take their defaults, keys that are not fields are ignored. Raises
    ValidationError for a value a field cannot parse."""
    # Positional arguments in field order: Model.__init__'s fast path (~4x faster than keywords,
    # and the hot cache runs this N times per hit).
    return Turn(*(
        f.to_python(data[f.attname]) if f.attname in data else f.get_default()
        for f in TURN_FIELDS
    ))


def turn_dump(turn: Turn) -> str:
    """:func:`turn_data` as compact JSON."""
    return json.dumps(turn_data(turn), ensure_ascii=False, separators=(",", ":"))


def turn_load(raw: str | bytes) -> Turn:
    """The unsaved :class:`Turn` a :func:`turn_dump` string describes (:func:`turn_from_data`)."""
    return turn_from_data(json.loads(raw))
