"""Template tags of projects (issue 30).

``{% sidebar_projects %}``: the sidebar's Projects section (the user's projects, "New project").
``{% project_sources conversation answer %}``: "Sources" under an answer in a project chat, each
passage opening in place (a ``<details>``); nothing outside a project (no query).
"""

from __future__ import annotations

from django import template

from projects.selectors import project_list
from projects.sources import sources_by_answer

register = template.Library()


@register.inclusion_tag("projects/_sidebar.html", takes_context=True)
def sidebar_projects(context) -> dict:
    """The signed-in user's projects (projects/selectors.py ``project_list``), read once per
    request; ``current_project_id`` from the page marks the one it shows."""
    request = context.get("request")
    user = getattr(request, "user", None)
    projects = []
    if user is not None and user.is_authenticated:
        projects = getattr(request, "_sidebar_projects", None)
        if projects is None:
            projects = request._sidebar_projects = project_list(user=user)
    current = context.get("current_project_id")
    conversation = context.get("conversation")
    if current is None and conversation is not None:
        current = getattr(conversation, "project_id", None)
    return {"projects": projects, "current_project_id": current}


def _sources(request, conversation) -> dict:
    """The conversation's sources by answer id, read once per request and conversation."""
    cache = getattr(request, "_project_sources", None) if request is not None else None
    if cache is None:
        cache = {}
        if request is not None:
            request._project_sources = cache
    key = conversation.conversation_id
    if key not in cache:
        cache[key] = sources_by_answer(conversation=conversation)
    return cache[key]


@register.inclusion_tag("projects/_sources.html", takes_context=True)
def project_sources(context, conversation, answer, streaming: bool = False) -> dict:
    """The sources of ``answer`` (an assistant Turn, or the id of one being written) in
    ``conversation``; ``streaming``: drawn hidden, shown when the answer is done
    (static/chat/chat.js)."""
    if conversation is None or answer is None or getattr(conversation, "project_id", None) is None:
        return {"sources": []}
    answer_id = getattr(answer, "turn_id", answer)
    return {
        "sources": _sources(context.get("request"), conversation).get(answer_id, []),
        "answer_id": answer_id,
        "streaming": streaming,
    }
