"""Who is asking: the client's IP address and user agent, as sign-in throttling and the sessions
page need them.

Behind the shipped nginx (deploy/nginx.conf) every request reaches the server (uvicorn) from 127.0.0.1 and
nginx appends the address it saw to ``X-Forwarded-For`` (``$proxy_add_x_forwarded_for``). The
client is then the entry that many places from the right, counting the proxies we run
(``settings.CHAT_ACCOUNTS_TRUSTED_PROXIES``); entries further left come from the client itself
and are never believed, or anyone could pick the address their failed sign-ins count against.
"""

from __future__ import annotations

import ipaddress

from django.conf import settings
from django.http import HttpRequest

USER_AGENT_CHARS = 300  # stored on UserSession; longer strings are cut


def trusted_proxies() -> int:
    """How many reverse proxies of ours stand in front of the app: the setting, or when it is
    unset (None), 1 if the app trusts a proxy's ``X-Forwarded-Proto`` (SECURE_PROXY_SSL_HEADER,
    as behind deploy/nginx.conf), else 0."""
    configured = getattr(settings, "CHAT_ACCOUNTS_TRUSTED_PROXIES", None)
    if configured is not None:
        return int(configured)
    return 1 if getattr(settings, "SECURE_PROXY_SSL_HEADER", None) else 0


def client_ip(request: HttpRequest) -> str | None:
    """The client's IP address as text (``"203.0.113.7"``, ``"2001:db8::1"``), or None when the
    request does not say (a test request without REMOTE_ADDR, a malformed header).

    With N trusted proxies: the N-th ``X-Forwarded-For`` entry from the right; with none, or a
    header with fewer entries than that (a request that bypassed the proxy), REMOTE_ADDR.
    """
    candidate = request.META.get("REMOTE_ADDR", "")
    hops = trusted_proxies()
    if hops > 0:
        forwarded = [p.strip() for p in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")]
        forwarded = [p for p in forwarded if p]
        if len(forwarded) >= hops:
            candidate = forwarded[-hops]
    try:
        return str(ipaddress.ip_address(candidate.strip()))
    except ValueError:
        return None


def ip_throttle_scope(ip: str | None) -> str:
    """The address block one client controls, as a throttle key part: an IPv4 address as it is,
    an IPv6 address's /64 network (one subscriber gets a whole /64, RFC 6177, so counting single
    IPv6 addresses would let one client rotate through 2^64 of them); ``"unknown"`` for None."""
    if ip is None:
        return "unknown"
    address = ipaddress.ip_address(ip)
    if address.version == 6 and address.ipv4_mapped is None:
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address.ipv4_mapped or address) if address.version == 6 else str(address)


def user_agent(request: HttpRequest) -> str:
    """The request's User-Agent header, at most :data:`USER_AGENT_CHARS` characters."""
    return request.META.get("HTTP_USER_AGENT", "")[:USER_AGENT_CHARS]
