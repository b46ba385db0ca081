"""What the chat's views share: the template contexts of the chat page and its fragments, and
the responses several of them send.

The page's parts: the sidebar's list (:func:`sidebar_context`, also used by the project pages),
a page of exchanges of the branch shown (:func:`exchanges_context`, one exchange:
:func:`exchange_context`, its ``< i/n >`` controls: :func:`versions_context`) and the composer's
model picker (:func:`model_choices`); :func:`page_context` puts them together. The responses: an
error above the message box (:func:`error_response`) and the exchanges that fill ``#messages``
(:func:`messages_response`). Sync code that reads the database: async views call it through
``sync_to_async``. No view lives here.
"""

from __future__ import annotations

import dataclasses
from urllib.parse import urlsplit
from uuid import UUID

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.template.loader import render_to_string
from django.urls import Resolver404, resolve
from django.utils import timezone

from accounts.callers import caller_for
from conversations import page_selectors, selectors, services, sidebar, turnlog
from conversations.models import Conversation, Turn
from core.rendering import markdown_to_safe_html
from gateway import gate
from inference.pools import pool_set
from moderation.gate import verdict_message, withdrawn_message


def is_htmx(request: HttpRequest) -> bool:
    return request.headers.get("HX-Request") == "true"


def sidebar_context(user, cookies: dict, *, current_id: UUID | None) -> dict:
    """The sidebar's list (templates/chat/_conversation_list.html): ``groups`` (conversations/
    sidebar.py: Pinned, Today, ... by month, in the time zone of the browser's ``tz`` cookie)
    and ``current_id``, the conversation shown beside it (its row is marked), or None. Reads
    the database: call it from sync code. (The Projects section above the list is a template
    tag: projects/templatetags/project_tags.py.) Also used by the project pages."""
    tz = sidebar.time_zone_from(cookies.get(sidebar.TIME_ZONE_COOKIE), settings.TIME_ZONE)
    return {
        "groups": sidebar.sidebar_groups(
            selectors.conversation_list(user=user), now=timezone.now(), tz=tz
        ),
        "current_id": current_id,
    }


def current_conversation_id(request: HttpRequest) -> UUID | None:
    """The conversation whose page sent this htmx request (its ``HX-Current-URL``), or None:
    a sidebar refreshed from there keeps that row marked."""
    url = request.headers.get("HX-Current-URL", "")
    try:
        match = resolve(urlsplit(url).path) if url else None
    except Resolver404:
        return None
    if match is None or match.url_name != "conversation":
        return None
    return match.kwargs["conversation_id"]


def page_context(request: HttpRequest, conversation: Conversation | None) -> dict:
    exchanges, earlier = exchanges_context(conversation)
    return {
        "conversation": conversation,
        **sidebar_context(
            request.user, request.COOKIES,
            current_id=conversation.conversation_id if conversation is not None else None,
        ),  # fmt: skip
        "exchanges": exchanges,
        "earlier": earlier,
        "max_message_chars": settings.CHAT_MAX_MESSAGE_CHARS,
        "system_prompt_max": services.SYSTEM_PROMPT_MAX_CHARS,
        **model_choices(request.user, conversation),
    }


def exchanges_context(
    conversation: Conversation | None, *, streaming: dict | None = None, before: UUID | None = None
) -> tuple[list[dict], UUID | None]:
    """The template contexts of a page of the exchanges of the branch shown (templates/chat/
    _messages.html; page_selectors.exchange_page: the newest EXCHANGES_PAGE above ``before``), and
    the cursor of the page before them (None: they start the conversation). ``streaming``:
    question turn id -> the id its answer being written will have (its actions appear when it
    is done). Raises page_selectors.BadCursor for a ``before`` not on the branch shown."""
    if conversation is None:
        return [], None
    streaming = streaming or {}
    page = page_selectors.exchange_page(conversation=conversation, before=before)
    contexts = []
    for x in page.exchanges:
        answer_id = streaming.get(x.question.turn_id)
        if answer_id is not None:  # the page follows its stream (done may be sent at once)
            x = dataclasses.replace(x, answer=None, answers=())
        elif x.answer is None and not blocked(x.question):
            # Being written (a page loaded mid-answer): its id gives the bubble the action row
            # a freshly sent answer has, shown when the stream ends. None if Redis does not
            # know it (then the page shows the stored answer once it is reloaded).
            answer_id = turnlog.answer_for_question_sync(
                x.question.turn_id, conversation_id=conversation.conversation_id
            )
        contexts.append(exchange_context(conversation, x, answer_id=answer_id))
    return contexts, page.earlier


def model_choices(user, conversation: Conversation | None) -> dict:
    """The composer's model picker: the pools the user's tier (or a feature flag) allows, and
    the one selected (the conversation's model if the tier still allows it, else the pool the
    router gives the user by default)."""
    pools = pool_set().for_tier(user.tier, user.feature_flags or ())
    names = [p.name for p in pools]
    selected = conversation.model if conversation is not None else ""
    if selected not in names:
        try:
            selected = gate.route_for(caller_for(user)).pool.name
        except gate.Refused:
            selected = names[0] if names else ""
    return {"models": pools, "selected_model": selected}


def exchange_context(
    conversation: Conversation,
    exchange: selectors.Exchange,
    *,
    answer_id: UUID | None = None,
    versions: dict | None = None,
) -> dict:
    """Template context of one exchange. ``answer_id``: the id the answer being streamed will
    have (its actions appear when it is done); ``versions``: the ``< i/n >`` state of an answer
    being streamed (:func:`versions_context`); a stored answer's comes from ``exchange.answers``."""
    answer = exchange.answer
    if answer is not None:
        versions = versions_context(exchange.answers or (answer,), answer)
    question = exchange.question
    return {
        "conversation": conversation,
        "question": question,
        # ``< i/n >`` of the message among its versions (branches, conversations/versions.py).
        "question_versions": versions_context(exchange.questions, question) if question and exchange.questions else None,
        "answer": answer,
        "answer_html": markdown_to_safe_html(answer.content) if answer else "",
        # Unanswered: the page (re)attaches to the live stream, or starts it after a restart;
        # a message the input gate blocked is never answered (it shows why instead).
        "streaming": answer is None and not blocked(exchange.question),
        "blocked_message": blocked_message(exchange.question),
        "withdrawn_message": (
            withdrawn_message((answer.moderation_verdict or {}).get("categories") or [])
            if answer is not None and answer.status == Turn.Status.BLOCKED else ""
        ),
        "answer_id": answer_id,
        "versions": versions,
        # "Used N tools" above an answer written after tool calls (templates/chat/_tool_uses.html).
        "tool_uses": exchange.tool_uses,
    }


def blocked(question: Turn | None) -> bool:
    return question is not None and question.status == Turn.Status.BLOCKED


def blocked_message(question: Turn | None) -> str:
    """Why the input gate blocked ``question`` (moderation/verdicts.py), or ""."""
    if not blocked(question):
        return ""
    return verdict_message(question.moderation_verdict or {})


def versions_context(answers, answer: Turn) -> dict:
    """``< i/n >`` of ``answer`` among ``answers`` (its versions, oldest first): 1-based
    ``index``, ``total``, and the ids of the ``prev`` / ``next`` versions (None at the ends)."""
    ids = [a.turn_id for a in answers]
    if answer.turn_id not in ids:
        ids.append(answer.turn_id)
    i = ids.index(answer.turn_id)
    return {
        "index": i + 1,
        "total": len(ids),
        "prev": ids[i - 1] if i > 0 else None,
        "next": ids[i + 1] if i + 1 < len(ids) else None,
    }


def error_response(
    request: HttpRequest, message: str, status: int, headers: dict[str, str] | None = None
) -> HttpResponse:
    """A message the person can act on, shown above the message box (htmx) or as a page.
    ``headers``: e.g. a refusal's Retry-After and X-RateLimit-* (gateway/gate.py)."""
    html = render_to_string("chat/_error.html", {"message": message}, request=request)
    response = HttpResponse(html, status=status)
    for name, value in (headers or {}).items():
        response[name] = value
    if is_htmx(request):
        response["HX-Retarget"] = "#composer-error"
        response["HX-Reswap"] = "innerHTML"
    return response


def messages_response(request: HttpRequest, conversation: Conversation, *, streaming: dict | None = None) -> HttpResponse:
    """The newest page of the exchanges of the branch shown, as the fragment that fills
    ``#messages`` (with the sentinel that loads the page before it)."""
    exchanges, earlier = exchanges_context(conversation, streaming=streaming)
    context = {
        "conversation": conversation,
        "exchanges": exchanges,
        "earlier": earlier,
        "max_message_chars": settings.CHAT_MAX_MESSAGE_CHARS,
    }
    return HttpResponse(render_to_string("chat/_messages.html", context, request=request))
