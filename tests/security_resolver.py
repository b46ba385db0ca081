"""The site's URL patterns as the resolver has them, the ones the security table
(tests/security_routes.py, issue 10) says nothing about, and concrete paths for the admin's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from django.apps import apps
from django.contrib.contenttypes.models import ContentType
from django.db import DEFAULT_DB_ALIAS
from django.urls import URLPattern, URLResolver, get_resolver

from conversations.models import Conversation
from tests.security_routes import BY_NAME, OPTIONAL_PUBLIC

# --- the resolver -------------------------------------------------------------------------------


@dataclass(frozen=True)
class SiteRoute:
    """A URL pattern as the resolver has it: the whole pattern text and its namespaced name."""

    pattern: str
    name: str | None


def site_routes(patterns=None, prefix: str = "", namespace: str = "") -> list[SiteRoute]:
    """Every URL pattern under ``patterns`` (default: the site's), walked recursively."""
    found = []
    for entry in get_resolver().url_patterns if patterns is None else patterns:
        if isinstance(entry, URLResolver):
            inner = ":".join(n for n in (namespace, entry.namespace) if n)
            found += site_routes(entry.url_patterns, prefix + str(entry.pattern), inner)
        elif isinstance(entry, URLPattern):
            name = ":".join(n for n in (namespace, entry.name) if n) if entry.name else None
            found.append(SiteRoute(prefix + str(entry.pattern), name))
    return found


def is_admin(route: SiteRoute) -> bool:
    return route.pattern.startswith("admin/")


def uncovered(routes: list[SiteRoute]) -> list[SiteRoute]:
    """The routes the security table says nothing about: not a row, not an optional public
    route, and not under ``admin/`` (the ADMIN rule covers those)."""
    covered = {*BY_NAME, *OPTIONAL_PUBLIC}
    return [
        r for r in routes if r.name not in covered and not (is_admin(r) and r.name != "admin:login")
    ]


def admin_path(route: SiteRoute, world) -> str:
    """A concrete path for an admin pattern: object ids of a real row of the route's model."""
    text = route.pattern.replace("^", "").replace("$", "")
    text = re.sub(r"\(\?P<app_label>[^)]*\)", "conversations", text)
    text = re.sub(r"\(\?P<url>\.\*\)", "no-such-page/", text)

    def value(match: re.Match) -> str:
        param = match.group(1)
        if param == "content_type_id":
            return str(ContentType.objects.get_for_model(Conversation).pk)
        if param == "id":
            return str(world.alice.pk)
        if text.startswith("admin/r/"):  # "view on site": a conversation
            return str(world.conversation.pk)
        model = apps.get_model(*re.match(r"admin/(\w+)/(\w+)/", text).groups())
        row = model._base_manager.using(DEFAULT_DB_ALIAS).order_by("pk").first()
        return str(row.pk if row is not None else 1)

    return "/" + re.sub(r"<(?:\w+:)?(\w+)>", value, text)


ADMIN_ROUTES = [r for r in site_routes() if is_admin(r) and r.name != "admin:login"]
