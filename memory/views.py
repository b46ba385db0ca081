"""The memory page (``/settings/memory/``): see every fact and where it came from, add one by
hand, delete one or all, switch memory on or off. Thin: each view calls a service or selector."""

from __future__ import annotations

from uuid import UUID

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from conversations.models import Conversation
from memory import selectors, services


def _conversation_titles(user, facts) -> dict[UUID, str]:
    """The titles of the conversations the facts came from that still exist (and are the
    user's), by id; a deleted conversation is simply absent (the page then names no link)."""
    ids = {f.source_conversation_id for f in facts if f.source_conversation_id}
    if not ids:
        return {}
    rows = Conversation.objects.filter(conversation_id__in=ids, owner_id=user.pk).values_list("conversation_id", "title")
    return {cid: title or "Untitled conversation" for cid, title in rows}


def _page(request: HttpRequest, *, error: str | None = None, draft: str = "", status: int = 200) -> HttpResponse:
    facts = selectors.memory_list(user=request.user)
    titles = _conversation_titles(request.user, facts)
    rows = [{"fact": f, "conversation_title": titles.get(f.source_conversation_id)} for f in facts]
    response = render(
        request, "memory/memory.html",
        {"rows": rows, "error": error, "draft": draft, "fact_chars": settings.CHAT_MEMORY_FACT_CHARS},
        status=status,
    )  # fmt: skip
    response["Cache-Control"] = "no-store"
    return response


@require_http_methods(["GET", "POST"])
@login_required
def memory_page(request: HttpRequest) -> HttpResponse:
    """``GET``: the page. ``POST text=...``: add a fact by hand (400 with the page and the
    message for an empty or too long fact, or one past the per-user cap); a near-duplicate of a
    stored fact is not stored again."""
    if request.method == "POST":
        text = request.POST.get("text", "")
        try:
            added = services.memory_add(user=request.user, texts=[text])
        except ValidationError as exc:
            return _page(request, error=exc.messages[0], draft=text, status=400)
        return redirect("memory-settings" if added else "memory-settings-duplicate")
    return _page(request)


@login_required
def memory_page_duplicate(request: HttpRequest) -> HttpResponse:
    """The page after an addition that was a near-duplicate of a stored fact (says so)."""
    return _page(request, error="That is already remembered (a very similar fact is stored).")


@require_POST
@login_required
def memory_delete(request: HttpRequest, fact_id: UUID) -> HttpResponse:
    """Delete one of the user's facts; 404 when it is not theirs (or gone)."""
    if not services.memory_remove(user=request.user, fact_ids=[fact_id]):
        raise Http404("No such fact.")
    return redirect("memory-settings")


@require_POST
@login_required
def memory_clear(request: HttpRequest) -> HttpResponse:
    """Delete all of the user's facts (the form's ``confirm=yes`` box must be ticked; without it
    nothing is deleted: 400 with the page)."""
    if request.POST.get("confirm") != "yes":
        return _page(request, error="Tick the box to confirm deleting everything.", status=400)
    services.memory_clear(user=request.user)
    return redirect("memory-settings")


@require_POST
@login_required
def memory_toggle(request: HttpRequest) -> HttpResponse:
    """Switch memory on (``enabled=on``) or off (anything else)."""
    services.memory_set_enabled(user=request.user, enabled=request.POST.get("enabled") == "on")
    return redirect("memory-settings")


@require_POST
@login_required
def memory_update_undo(request: HttpRequest, update_id: UUID) -> HttpResponse:
    """Undo a "Memory updated" (memory/updates.py): htmx gets the notice again (now "undone"),
    a plain form post goes back to the conversation. 404 when the update is not the user's."""
    from memory.models import MemoryUpdate  # noqa: PLC0415
    from memory.updates import memory_update_undo as undo  # noqa: PLC0415

    try:
        update = undo(user=request.user, update_id=update_id)
    except MemoryUpdate.DoesNotExist:
        raise Http404("No such memory update.") from None
    if request.headers.get("HX-Request"):
        return render(request, "memory/_update.html", {"update": update})
    if update.conversation_id:
        return redirect("conversation", update.conversation_id)
    return redirect("memory-settings")
