"""Long conversations (issue 29): the chat page shows the newest EXCHANGES_PAGE exchanges of
the branch shown and loads earlier pages by keyset (``GET /c/<id>/earlier?before=<question
id>``), reading the text of the page's turns only. Django test client, real PostgreSQL;
conversations come from tests/long_conversation.py's bulk seeder."""

from __future__ import annotations

import re
import uuid

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from conversations import services
from conversations.models import Turn
from conversations.page_selectors import EXCHANGES_PAGE
from tests.long_conversation import long_conversation_seed, question_text

pytestmark = pytest.mark.django_db

QUESTION = re.compile(r'<article class="turn user" id="turn-([0-9a-f-]+)">\s*<div class="bubble plain">([^<]*)</div>')
SENTINEL = re.compile(r'data-earlier[^>]*hx-get="/c/[0-9a-f-]+/earlier\?before=([0-9a-f-]+)"')


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def shown(html: str) -> list[str]:
    """The user messages a page (or fragment) shows, top to bottom."""
    return [text for _, text in QUESTION.findall(html)]


def cursor(html: str) -> str | None:
    """The ``before`` of the fragment's top sentinel, None when it has none."""
    found = SENTINEL.findall(html)
    assert len(found) <= 1, found
    return found[0] if found else None


def texts(indices) -> list[str]:
    return [question_text(i) for i in indices]


def test_the_page_holds_the_newest_exchanges_of_a_3000_turn_conversation(make_user):
    """Given 3,000 turns with 20 branches (1,460 exchanges on the branch shown), when the
    conversation opens, then it shows the newest 30 exchanges in order and a sentinel whose
    cursor is the oldest of them."""
    user = make_user()
    seeded = long_conversation_seed(owner=user, turns=3000, branches=20)
    main = len(seeded.questions)

    html = signed_in(user).get(f"/c/{seeded.conversation.pk}/").content.decode()

    assert shown(html) == texts(range(main - EXCHANGES_PAGE, main))
    assert cursor(html) == str(seeded.questions[main - EXCHANGES_PAGE])


def test_earlier_returns_the_page_before_in_order(make_user):
    """Given a conversation open at its newest page, when the sentinel asks for the page
    before, then the 30 exchanges above the cursor come oldest first, with the next cursor."""
    user = make_user()
    seeded = long_conversation_seed(owner=user, turns=200)
    client = signed_in(user)
    first = cursor(client.get(f"/c/{seeded.conversation.pk}/").content.decode())

    response = client.get(f"/c/{seeded.conversation.pk}/earlier", {"before": first})

    assert response.status_code == 200
    html = response.content.decode()
    assert shown(html) == texts(range(100 - 2 * EXCHANGES_PAGE, 100 - EXCHANGES_PAGE))
    assert cursor(html) == str(seeded.questions[100 - 2 * EXCHANGES_PAGE])


def test_paging_ends_at_the_first_message_with_every_exchange_shown_once(make_user):
    """Given 70 exchanges, when the pages are followed up to the top, then the last one holds
    the first 10 and no sentinel, and together the pages hold every exchange once, in order."""
    user = make_user()
    seeded = long_conversation_seed(owner=user, turns=140)
    client = signed_in(user)
    html = client.get(f"/c/{seeded.conversation.pk}/").content.decode()
    pages = [shown(html)]
    before = cursor(html)

    while before is not None:
        html = client.get(f"/c/{seeded.conversation.pk}/earlier", {"before": before}).content.decode()
        pages.insert(0, shown(html))
        before = cursor(html)

    assert [len(p) for p in pages] == [10, 30, 30]
    assert "data-earlier" not in html
    assert [text for page in pages for text in page] == texts(range(70))


def test_a_short_conversation_has_no_sentinel(make_user):
    user = make_user()
    seeded = long_conversation_seed(owner=user, turns=20)

    html = signed_in(user).get(f"/c/{seeded.conversation.pk}/").content.decode()

    assert shown(html) == texts(range(10))
    assert "data-earlier" not in html


@pytest.mark.parametrize("kind", ["not an id", "missing", "an answer", "another conversation's", "unknown"])
def test_a_bad_cursor_is_refused_with_400_and_a_message(make_user, kind):
    user = make_user()
    seeded = long_conversation_seed(owner=user, turns=100)
    other = long_conversation_seed(owner=user, turns=100)
    answer = Turn.objects.filter(conversation=seeded.conversation, role=Turn.Role.ASSISTANT).first()
    before = {
        "not an id": "12345",
        "missing": None,
        "an answer": str(answer.turn_id),
        "another conversation's": str(other.questions[40]),
        "unknown": str(uuid.uuid4()),
    }[kind]
    query = {"before": before} if before is not None else {}

    response = signed_in(user).get(f"/c/{seeded.conversation.pk}/earlier", query)

    assert response.status_code == 400
    assert "data-earlier-error" in response.content.decode()
    assert "message" in response.content.decode()  # says what is wrong, in words


def test_a_cursor_from_a_branch_switched_away_from_is_refused(make_user):
    """Given a page loaded on one branch, when another branch is chosen above the cursor, then
    the old cursor is refused (400): its page would belong to a branch no longer shown."""
    user = make_user()
    seeded = long_conversation_seed(owner=user, turns=208, branches=2)  # 100 exchanges, forks at 1, 50
    client = signed_in(user)
    before = cursor(client.get(f"/c/{seeded.conversation.pk}/").content.decode())
    edit = Turn.objects.get(pk=seeded.forks[50])
    services.branch_select(conversation=seeded.conversation, question=edit, parent_id=seeded.questions[49])

    response = client.get(f"/c/{seeded.conversation.pk}/earlier", {"before": before})

    assert response.status_code == 400


def test_another_users_conversation_is_404(make_user):
    owner, stranger = make_user(), make_user()
    seeded = long_conversation_seed(owner=owner, turns=100)

    response = signed_in(stranger).get(
        f"/c/{seeded.conversation.pk}/earlier", {"before": str(seeded.questions[40])}
    )

    assert response.status_code == 404


def test_the_branch_chosen_is_the_one_paged(make_user):
    """Given 96 exchanges with a fork at question 48 whose edit was chosen, when the page
    opens and pages back, then the pages follow the chosen branch (questions 0-47, the edit
    with its ``2/2``, its follow-up), not the main one."""
    user = make_user()
    seeded = long_conversation_seed(owner=user, turns=200, branches=2)  # 96 exchanges, forks at 1, 48
    edit = Turn.objects.get(pk=seeded.forks[48])
    services.branch_select(conversation=seeded.conversation, question=edit, parent_id=seeded.questions[47])
    client = signed_in(user)

    html = client.get(f"/c/{seeded.conversation.pk}/").content.decode()
    earlier = client.get(f"/c/{seeded.conversation.pk}/earlier", {"before": cursor(html)}).content.decode()

    assert shown(html) == texts(range(20, 48)) + [
        f"{question_text(48)} (edited)", "A follow-up on the edit of question 48"
    ]
    assert re.search(r'class="version-index">2/2<', html)
    assert shown(earlier) == texts(range(20))


def test_the_answer_version_chosen_is_shown_on_the_paged_view(make_user):
    """Given the newest question with a regenerated answer and the first version chosen, when
    the page opens, then it shows that version with ``1/2``."""
    user = make_user()
    seeded = long_conversation_seed(owner=user, turns=100)
    question = Turn.objects.get(pk=seeded.questions[-1])
    old = Turn.objects.get(reply_to=question)
    Turn.objects.create(
        conversation=seeded.conversation, role=Turn.Role.ASSISTANT, content="A regenerated answer.",
        reply_to=question, replaces=old,
    )  # fmt: skip
    services.answer_select(conversation=seeded.conversation, question_id=question.turn_id, answer_id=old.turn_id)

    html = signed_in(user).get(f"/c/{seeded.conversation.pk}/").content.decode()

    assert "A regenerated answer." not in html
    assert f'id="turn-{old.turn_id}"' in html
    assert re.search(r'class="version-index">1/2<', html)


def _open(client: Client, conversation) -> list[dict]:
    with CaptureQueriesContext(connection) as queries:
        response = client.get(f"/c/{conversation.pk}/")
    assert response.status_code == 200
    return queries.captured_queries


def test_opening_costs_as_many_queries_at_3000_turns_as_at_100(make_user):
    """Given a 100-turn and a 3,000-turn (20 branches) conversation of one user, when each is
    opened, then both take the same, bounded number of SQL queries: none grows with turns."""
    user = make_user()
    short = long_conversation_seed(owner=user, turns=100)
    long = long_conversation_seed(owner=user, turns=3000, branches=20)
    client = signed_in(user)
    _open(client, short.conversation)  # warm the per-process caches (pools, settings)

    few = _open(client, short.conversation)
    many = _open(client, long.conversation)

    assert len(many) == len(few), [q["sql"][:120] for q in many]
    assert len(many) <= 50


def test_opening_reads_text_only_for_the_page(make_user):
    """Given a 3,000-turn conversation, when it opens, then every query that reads turn text
    names the turns it wants (the page's), and the text read is the page's, not the log's."""
    user = make_user()
    seeded = long_conversation_seed(owner=user, turns=3000, branches=20)

    queries = _open(signed_in(user), seeded.conversation)

    text_reads = [q["sql"] for q in queries if '"conversations_turn"."content"' in q["sql"]]
    assert text_reads, "the page's text is read from somewhere"
    for sql in text_reads:
        assert '"conversations_turn"."turn_id" IN (' in sql, sql[:300]
        ids = re.findall(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", sql)
        assert len(ids) <= 2 * EXCHANGES_PAGE + 2, "more ids than the page has turns"
