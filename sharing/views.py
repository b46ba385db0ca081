"""Share links: the owner's pages (a conversation's links: create, update, revoke; all their
links) and the public pages (``/s/<token>/``, and "Continue this conversation").

Thin: parse, call a service or selector, render. Every form posts with CSRF; nothing here
needs script. The shared page sends ``Referrer-Policy: no-referrer`` (the token is in its URL,
and links in the conversation must not carry it to other sites), ``X-Robots-Tag: noindex`` and
``Cache-Control: no-store`` (a revoked link must not live on in a cache), its 404 too.

Why the shared page has no form: under ``no-referrer`` a browser sends ``Origin: null`` with
a form's POST (Fetch standard, "serialize a request origin"), which Django's CSRF check rightly
refuses. So "Continue this conversation" is a link to a small confirmation page, which shows
no conversation content and posts under the site's ``same-origin`` policy (a Referer only ever
goes to this site). The owner's pages hold forms too and keep that default policy.
"""

from __future__ import annotations

from uuid import UUID

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST, require_safe

from conversations import selectors as conversation_selectors
from conversations.models import Turn
from core.rendering import markdown_to_safe_html
from projects.selectors import sources_by_answer
from sharing import selectors, services
from sharing.models import ShareLink


def _private(response: HttpResponse) -> HttpResponse:
    """Headers of every page that shows a share URL or a shared conversation: never cached."""
    response["Cache-Control"] = "no-store"
    return response


def _public(response: HttpResponse, *, referrer_policy: str = "no-referrer") -> HttpResponse:
    """Headers of the public pages (their 404s too): not indexed, not cached, and (the shared
    page) no Referer at all. The confirmation page, which has a form, passes ``same-origin``."""
    response["X-Robots-Tag"] = "noindex, nofollow"
    response["Referrer-Policy"] = referrer_policy
    return _private(response)


def _share_url(request: HttpRequest, link: ShareLink) -> str:
    return request.build_absolute_uri(reverse("shared", args=[link.token]))


# --- the owner's pages -------------------------------------------------------------------------


def _manage_page(
    request: HttpRequest, conversation, *, error: str = "", status: int = 200
) -> HttpResponse:
    links = [
        {"link": link, "url": _share_url(request, link)}
        for link in selectors.share_link_list(conversation=conversation)
    ]
    newest = selectors.newest_turn(conversation=conversation)
    response = render(
        request,
        "sharing/manage.html",
        {
            "conversation": conversation,
            "links": links,
            "error": error,
            # Whether the conversation has turns newer than a link's snapshot ("Update" says so).
            "newest_at": newest.created_at if newest is not None else None,
        },
        status=status,
    )
    return _private(response)


@require_http_methods(["GET", "HEAD", "POST"])
@login_required
def share_manage(request: HttpRequest, conversation_id: UUID) -> HttpResponse:
    """``GET``: the conversation's share page (its working links, each with Update and Revoke).
    ``POST``: make a new link to the conversation as it is now, then back to the page (400 with
    the page and the reason when it cannot be shared). 404 unless the conversation is the
    user's."""
    conversation = conversation_selectors.conversation_get_for_user(
        conversation_id=conversation_id, user=request.user
    )
    if request.method == "POST":
        try:
            services.share_link_create(conversation=conversation, user=request.user)
        except ValidationError as exc:
            return _manage_page(request, conversation, error=exc.messages[0], status=400)
        except PermissionDenied as exc:
            return _manage_page(request, conversation, error=str(exc), status=403)
        messages.success(
            request, "Link created. Anyone with it can read the conversation up to now."
        )
        return redirect("share-manage", conversation_id=conversation.pk)
    return _manage_page(request, conversation)


def _back(request: HttpRequest, conversation) -> HttpResponse:
    """Where a link action returns: the shared-links settings page when it came from there
    (``back=all``), else the conversation's share page."""
    if request.POST.get("back") == "all":
        return redirect("shared-links")
    return redirect("share-manage", conversation_id=conversation.pk)


@require_POST
@login_required
def share_update(request: HttpRequest, conversation_id: UUID, link_id: UUID) -> HttpResponse:
    """Move a link's snapshot up to the conversation's newest turn (same URL). 404 unless the
    conversation is the user's and the link one of its working links."""
    conversation = conversation_selectors.conversation_get_for_user(
        conversation_id=conversation_id, user=request.user
    )
    link = selectors.share_link_get_for_owner(conversation=conversation, link_id=link_id)
    try:
        services.share_link_update(conversation=conversation, link=link, user=request.user)
    except ValidationError as exc:
        return _manage_page(request, conversation, error=exc.messages[0], status=400)
    except PermissionDenied as exc:
        return _manage_page(request, conversation, error=str(exc), status=403)
    messages.success(request, "Link updated: it now shows the conversation up to now.")
    return _back(request, conversation)


@require_POST
@login_required
def share_revoke(request: HttpRequest, conversation_id: UUID, link_id: UUID) -> HttpResponse:
    """Revoke a link: from now on it answers 404. 404 unless the conversation is the user's and
    the link one of its working links."""
    conversation = conversation_selectors.conversation_get_for_user(
        conversation_id=conversation_id, user=request.user
    )
    link = selectors.share_link_get_for_owner(conversation=conversation, link_id=link_id)
    try:
        services.share_link_revoke(conversation=conversation, link=link, user=request.user)
    except PermissionDenied as exc:
        return _manage_page(request, conversation, error=str(exc), status=403)
    messages.success(request, "Link revoked: it no longer works.")
    return _back(request, conversation)


@require_safe
@login_required
def shared_links(request: HttpRequest) -> HttpResponse:
    """Every working link the user made, across their conversations, with Revoke."""
    links = [
        {"link": link, "url": _share_url(request, link)}
        for link in selectors.share_link_list_for_user(user=request.user)
    ]
    return _private(render(request, "sharing/shared_links.html", {"links": links}))


# --- the public pages --------------------------------------------------------------------------


def _not_found(request: HttpRequest) -> HttpResponse:
    return _public(
        render(request, "sharing/not_found.html", {"message": selectors.NOT_FOUND}, status=404)
    )


def _exchange_context(exchange: selectors.SharedExchange, sources: dict | None = None) -> dict:
    """Template context of one shared exchange: the message as plain text (autoescaped), the
    answer as sanitised HTML (core/rendering.py, PF-X1) and a note on its status, the
    tool calls it was written after, and (``sources``: answer id -> its sources, in a project
    chat) the passages its prompt held, as the chat page shows them."""
    answer = exchange.answer
    note = ""
    if answer is None:
        note = "No answer had been written yet when this was shared."
    elif answer.status == Turn.Status.BLOCKED:
        note = "This answer was withdrawn by moderation."
    elif answer.status == Turn.Status.FAILED:
        note = "The answer failed."
    elif answer.status == Turn.Status.CANCELLED:
        note = "Stopped."
    elif not answer.content:
        note = "The model gave an empty answer."
    hidden = (Turn.Status.BLOCKED, Turn.Status.FAILED)  # withdrawn or failed: no text to show
    show_text = answer is not None and answer.status not in hidden
    return {
        "question": exchange.question,
        "answer": answer,
        "answer_html": markdown_to_safe_html(answer.content) if show_text else "",
        "note": note,
        "tool_uses": exchange.tool_uses if show_text else (),
        "sources": (sources or {}).get(answer.turn_id, []) if show_text else [],
    }


def _shared_page(request: HttpRequest, token: str) -> HttpResponse:
    """The shared page of ``token``, or the 404 page."""
    try:
        snapshot = selectors.snapshot_get(token=token)
    except Http404:
        return _not_found(request)
    # A project chat's answers show their sources (projects/sources.py; one query, none outside
    # a project): the copies kept with each answer, as the owner's page shows them.
    sources = sources_by_answer(
        conversation=snapshot.link.conversation,
        answer_ids=[x.answer.turn_id for x in snapshot.exchanges if x.answer is not None],
    )
    context = {
        "token": token,
        "snapshot": snapshot,
        "title": snapshot.title or "Shared conversation",
        "exchanges": [_exchange_context(x, sources) for x in snapshot.exchanges],
    }
    return _public(render(request, "sharing/shared.html", context))


def _confirm_page(
    request: HttpRequest, token: str, *, error: str = "", status: int = 200
) -> HttpResponse:
    """Asks the signed-in viewer to confirm copying the snapshot (its title and size only; no
    conversation text, no outbound links), or the 404 page. ``error``: why it did not work."""
    try:
        snapshot = selectors.snapshot_get(token=token)
    except Http404:
        return _not_found(request)
    context = {
        "token": token,
        "title": snapshot.title or "Shared conversation",
        "exchange_count": len(snapshot.exchanges),
        "error": error,
    }
    response = render(request, "sharing/continue.html", context, status=status)
    return _public(response, referrer_policy="same-origin")


@require_safe
def shared(request: HttpRequest, token: str) -> HttpResponse:
    """The public, read-only page of a share link (no sign-in needed). 404 (a page that says
    so) for a link that is malformed, unknown, revoked, to a deleted conversation, or whose
    creator can no longer read the conversation."""
    return _shared_page(request, token)


@require_http_methods(["GET", "HEAD", "POST"])
def shared_continue(request: HttpRequest, token: str) -> HttpResponse:
    """"Continue this conversation". Anonymous: off to sign in, then back here. ``GET`` (signed
    in): a page asking to confirm. ``POST``: copy the snapshot into a new conversation of the
    viewer's and open it. 404 as for :func:`shared`; 400 with the confirmation page and the
    reason when the viewer's account cannot hold the copy."""
    if not request.user.is_authenticated:
        try:
            selectors.snapshot_get(token=token)  # a dead link says so before any sign-in
        except Http404:
            return _not_found(request)
        return _public(redirect_to_login(reverse("shared-continue", args=[token])))
    if request.method != "POST":
        return _confirm_page(request, token)
    try:
        copy = services.share_continue(token=token, user=request.user)
    except Http404:
        return _not_found(request)
    except ValidationError as exc:
        return _confirm_page(request, token, error=exc.messages[0], status=400)
    return redirect("conversation", conversation_id=copy.pk)
