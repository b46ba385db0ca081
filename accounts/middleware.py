"""Keeps the sessions page's "last seen" current (issue 10).

For a signed-in browser request, at most once per ``settings.CHAT_ACCOUNTS_SESSION_TOUCH_S``
(60 s) per session, the session's UserSession row gets the time, the client's address and its
user agent (accounts/services.py ``user_session_touch``). When it last did so is kept in the
session itself, so the other requests of that minute cost no query beyond the session load that
authentication does anyway. ``/v1`` (bearer keys, no sessions) and requests without a session
cookie are passed straight through.

Goes after AuthenticationMiddleware. Sync and async capable: under ASGI the streaming views stay
on the event loop (the async session API and ``request.auser()``), and only a due refresh runs
the write in a thread.
"""

from __future__ import annotations

import time

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.conf import settings
from django.http import HttpRequest

from accounts import services
from accounts.request_info import client_ip, user_agent
from accounts.signals import SEEN_SESSION_KEY

SKIPPED_PREFIXES = ("/v1/", "/static/")


class UserSessionMiddleware:
    """Refreshes the current session's UserSession row at most once a minute (module doc)."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest):
        if self.is_async:
            return self.__acall__(request)
        if self._may_apply(request) and self._due(request.session.get(SEEN_SESSION_KEY)):
            user = request.user
            if user.is_authenticated:
                self._touch(request, user)
        return self.get_response(request)

    async def __acall__(self, request: HttpRequest):
        if self._may_apply(request) and self._due(await request.session.aget(SEEN_SESSION_KEY)):
            user = await request.auser()
            if user.is_authenticated:
                await sync_to_async(self._touch)(request, user)
        return await self.get_response(request)

    @staticmethod
    def _may_apply(request: HttpRequest) -> bool:
        return (
            hasattr(request, "session")
            and settings.SESSION_COOKIE_NAME in request.COOKIES
            and not request.path.startswith(SKIPPED_PREFIXES)
        )

    @staticmethod
    def _due(seen: float | None) -> bool:
        return seen is None or time.time() - float(seen) >= settings.CHAT_ACCOUNTS_SESSION_TOUCH_S

    @staticmethod
    def _touch(request: HttpRequest, user) -> None:
        session_key = request.session.session_key
        if not session_key:
            return
        services.user_session_touch(
            user=user, session_key=session_key, ip=client_ip(request), user_agent=user_agent(request)
        )
        request.session[SEEN_SESSION_KEY] = time.time()
