"""The flush after a transactional test survives a request that is still writing as it starts
(tests/conftest.py ``_flush_by_delete``): CI once failed with "Database test_chat_N couldn't be
flushed" after a browser test whose page was still sending requests."""

from __future__ import annotations

import threading

import pytest
from django.core.management import call_command
from django.db import connection, transaction

from accounts.models import User
from conversations.models import Conversation


@pytest.mark.django_db(transaction=True)
def test_a_flush_racing_a_late_write_is_run_again_and_empties_the_tables(make_user):
    """Given a person, and another connection that inserts their conversation and holds its
    transaction open for a second, when the flush runs meanwhile (its delete of the person waits
    on that transaction, whose row then breaks the deferred foreign key at the flush's commit),
    then the flush is run again and leaves neither row."""
    owner = make_user("late-writer")
    inserted, failure = threading.Event(), []

    def late_request() -> None:
        try:
            with transaction.atomic():
                Conversation.objects.create(owner=owner, model="m", region=owner.region, title="late")
                inserted.set()
                threading.Event().wait(1.0)
        except Exception as exc:  # noqa: BLE001 - reported to the test below
            failure.append(exc)
            inserted.set()
        finally:
            connection.close()

    writer = threading.Thread(target=late_request)
    writer.start()
    assert inserted.wait(10)

    call_command("flush", interactive=False, verbosity=0)
    writer.join(10)

    assert failure == []
    assert (User.objects.count(), Conversation.objects.count()) == (0, 0)
