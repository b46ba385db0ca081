"""The pydantic base every ``/v1`` request body builds on (api/schemas.py, feedback/api.py,
memory/api.py): ``Strict`` refuses unknown fields, ``Text`` refuses the NUL character.

It lives here, below the apps, so an app's ``/v1`` routes and the ``/v1`` package that mounts
them do not import each other.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict


def _no_nul(value: str) -> str:
    # PostgreSQL text cannot hold U+0000; refuse it up front instead of failing on insert.
    if "\x00" in value:
        raise ValueError("must not contain the NUL character (U+0000)")
    return value


Text = Annotated[str, AfterValidator(_no_nul)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=False)
