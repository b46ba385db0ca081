"""The ops a :class:`tests.pgcluster.AppProcess` app runs, and the loop that serves them
(``python -m tests.pgcluster_ops``): one JSON op per stdin line, one JSON reply per stdout line.
Each op calls the real services and selectors, then reports which servers its queries ran on
(``inet_server_port()`` and ``pg_is_in_recovery()`` asked on the very connections the router
picked).
"""

from __future__ import annotations

import contextlib
import json
import sys
import traceback
from collections.abc import Iterator

# Ops, run inside the app process (Django set up from the environment). Each returns JSON.


_recording = {"on": True}


@contextlib.contextmanager
def _unrecorded() -> Iterator[None]:
    """Queries in the block are left out of the op's report of servers."""
    _recording["on"] = False
    try:
        yield
    finally:
        _recording["on"] = True


def _user(username: str):
    """The user named ``username`` (a lookup in ``default``, left out of the report)."""
    from django.contrib.auth import get_user_model  # noqa: PLC0415

    with _unrecorded():
        return get_user_model().objects.get(username=username)


def op_migrate(database: str = "default") -> None:
    from django.core.management import call_command  # noqa: PLC0415

    call_command("migrate", database=database, verbosity=0)


def op_user_create(username: str, region: str) -> int:
    from django.contrib.auth import get_user_model  # noqa: PLC0415

    return get_user_model().objects.create_user(username=username, password="x", region=region).pk


def op_org_join(username: str, slug: str, region: str) -> int:
    from accounts.models import Membership, Organisation  # noqa: PLC0415

    org, _ = Organisation.objects.get_or_create(slug=slug, defaults={"name": slug, "region": region})
    Membership.objects.create(organisation=org, user=_user(username))
    return org.pk


def op_conversation_create(username: str) -> dict:
    from conversations import services  # noqa: PLC0415

    conversation = services.conversation_create(owner=_user(username))
    return {"conversation_id": str(conversation.pk), "region": conversation.region}


def op_turn_append_user(username: str, conversation_id: str, content: str) -> str:
    """Append a user turn; the report covers the write (services.turn_append_user), not the
    conversation's lookup before it."""
    from conversations import selectors, services  # noqa: PLC0415

    user = _user(username)
    with _unrecorded():
        conversation = selectors.conversation_get_for_user(conversation_id=conversation_id, user=user)
    # The owner's row, loaded here as a request's user is, goes with the write (its training
    # opt-out is read from it, not from the global database).
    return str(services.turn_append_user(conversation=conversation, content=content, owner=user).turn_id)


def op_turn_append_assistant(conversation_id: str, reply_to_id: str, content: str) -> str:
    import uuid  # noqa: PLC0415

    from conversations import services  # noqa: PLC0415

    turn = services.turn_append_assistant(
        conversation_id=conversation_id, turn_id=uuid.uuid4(), reply_to_id=reply_to_id,
        content=content, status="complete", prompt_tokens=1, completion_tokens=1,
    )  # fmt: skip
    return str(turn.turn_id)


def op_history(username: str, conversation_id: str, limit: int = 100) -> list[str]:
    """The ids of a conversation's newest turns (the /v1 history page's selector)."""
    from conversations import page_selectors, selectors  # noqa: PLC0415

    conversation = selectors.conversation_get_for_user(conversation_id=conversation_id, user=_user(username))
    turns, _ = page_selectors.turn_page(conversation=conversation, before=None, limit=limit)
    return [str(t.turn_id) for t in turns]


def op_conversation_list(username: str) -> list[str]:
    from conversations import selectors  # noqa: PLC0415

    return [str(c.pk) for c in selectors.conversation_list(user=_user(username))]


def op_conversation_page(username: str, limit: int) -> list[str]:
    from conversations import page_selectors  # noqa: PLC0415

    page, _ = page_selectors.conversation_page(user=_user(username), before=None, limit=limit)
    return [str(c.pk) for c in page]


def op_conversation_create_in_org(username: str, slug: str) -> dict:
    """A conversation of ``username`` in the workspace of organisation ``slug``."""
    from accounts.models import Organisation  # noqa: PLC0415
    from conversations import services  # noqa: PLC0415

    org = Organisation.objects.get(slug=slug)
    conversation = services.conversation_create(owner=_user(username), org=org)
    return {"conversation_id": str(conversation.pk), "region": conversation.region}


def op_share_link_made_and_revoked(username: str, conversation_id: str) -> str:
    """Make a share link to the conversation and revoke it (an audit entry that names the
    conversation); returns the link's id."""
    from conversations import selectors  # noqa: PLC0415
    from sharing.services import share_link_create, share_link_revoke  # noqa: PLC0415

    user = _user(username)
    conversation = selectors.conversation_get_for_user(conversation_id=conversation_id, user=user)
    link = share_link_create(conversation=conversation, user=user)
    share_link_revoke(conversation=conversation, link=link, user=user)
    return str(link.pk)


def op_user_id(username: str) -> int:
    return _user(username).pk


def op_api_key(username: str) -> str:
    """A new API key of ``username``: the raw ``Authorization: Bearer`` value."""
    from accounts.services import api_key_create  # noqa: PLC0415

    return api_key_create(user=_user(username), name="residency").raw


def op_org_zero_retention(slug: str) -> None:
    """Make the organisation ``slug`` zero-retention (issue 4)."""
    from accounts.models import Organisation  # noqa: PLC0415

    Organisation.objects.filter(slug=slug).update(zero_retention=True)


OPS = {name[3:]: fn for name, fn in dict(globals()).items() if name.startswith("op_")}


def _serve(ops: dict | None = None) -> None:
    """The app process's loop: one JSON op per stdin line, one JSON reply per stdout line:
    ``{"result": ..., "servers": [{"alias", "port", "in_recovery"}...]}`` or an error."""
    import django  # noqa: PLC0415

    django.setup()
    from django.db import connections  # noqa: PLC0415

    out = sys.stdout
    sys.stdout = sys.stderr  # stray prints must not corrupt the protocol
    for line in sys.stdin:
        request = json.loads(line)
        op = (ops or OPS)[request.pop("op")]
        used: list[str] = []
        try:
            with contextlib.ExitStack() as stack:
                for alias in connections:
                    stack.enter_context(
                        connections[alias].execute_wrapper(_recorder(alias, used))
                    )
                result = op(**request)
            reply = {"result": {"value": result, "servers": _servers(used)}}
        except Exception as exc:  # noqa: BLE001 - reported to the test
            traceback.print_exc()
            reply = {"error": type(exc).__name__, "message": str(exc)}
        finally:
            connections.close_all()  # as at the end of a request
        out.write(json.dumps(reply) + "\n")
        out.flush()


def _recorder(alias: str, used: list[str]):
    def record(execute, sql, params, many, context):
        if _recording["on"] and alias not in used:
            used.append(alias)
        return execute(sql, params, many, context)

    return record


def _servers(aliases: list[str]) -> list[dict]:
    """Which server each connection used by the op is on, asked on that same connection:
    ``{"alias", "port", "in_recovery"}``. A server the op used may be gone by the time it is
    asked (the failover test kills the primary while the op runs): that alias is then reported
    with ``port`` and ``in_recovery`` None and the ``error`` met, not raised, so the op's own
    result still reaches the test (issue 26)."""
    from django.db import DatabaseError, connections  # noqa: PLC0415

    servers = []
    for alias in aliases:
        try:
            with connections[alias].cursor() as cursor:
                cursor.execute("SELECT inet_server_port(), pg_is_in_recovery()")
                port, in_recovery = cursor.fetchone()
        except DatabaseError as exc:
            servers.append({"alias": alias, "port": None, "in_recovery": None,
                            "error": f"{type(exc).__name__}: {exc}"})  # fmt: skip
            continue
        servers.append({"alias": alias, "port": port, "in_recovery": in_recovery})
    return servers


if __name__ == "__main__":
    _serve()
