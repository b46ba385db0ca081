"""Signal receivers (connected in AccountsConfig.ready): record a session when someone signs in,
forget it when they sign out (the sessions page lists what is recorded)."""

from __future__ import annotations

import time

from django.contrib.auth.signals import user_logged_in, user_logged_out
from django.dispatch import receiver

from accounts import services
from accounts.request_info import client_ip, user_agent

# Session entry: when accounts/middleware.py last refreshed this session's row (epoch seconds).
SEEN_SESSION_KEY = "_chat_session_seen"


@receiver(user_logged_in, dispatch_uid="accounts.session_record")
def session_record(sender, request, user, **kwargs) -> None:
    """A sign-in (password, OIDC, the test client's force_login): record its session."""
    session = getattr(request, "session", None)
    if session is None:
        return
    if session.session_key is None:
        session.save()  # stores that create keys lazily (cache) get one now
    services.user_session_record(
        user=user,
        session_key=session.session_key,
        ip=client_ip(request),
        user_agent=user_agent(request),
    )
    session[SEEN_SESSION_KEY] = time.time()


@receiver(user_logged_out, dispatch_uid="accounts.session_forget")
def session_forget(sender, request, user, **kwargs) -> None:
    """A sign-out: the session is flushed right after this; drop its row."""
    session = getattr(request, "session", None)
    if session is not None:
        services.user_session_forget(session_key=session.session_key)
