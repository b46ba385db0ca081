"""Tenants and the engine's caches (DESIGN.md): the prefix-cache salt every engine request carries.

vLLM's prefix cache is a side channel: a request whose prompt shares a cached prefix returns
faster and reports ``cached_tokens``, so without isolation one user can learn, token by token,
what another sent (vLLM's advisory CVE-2025-46570). vLLM's answer is the ``cache_salt`` request
field (vLLM PR #17045): it is hashed into the key of a prompt's first KV block, so requests reuse
only blocks cached under the same salt.

The salt is derived here, on the server, from the tenant; never from anything a client sends:

- the conversation's owner, or for ``/v1/chat/completions`` and ``/v1/completions`` the API
  key's user (``user:<id>``), by default;
- the organisation (``org:<id>``) when the request runs in an organisation's workspace and the
  organisation chose to share one cache among its members (``Organisation.share_prefix_cache``,
  off by default; it arrives as ``Caller.org_shares_cache``).

A tenant's own requests keep sharing their cache: every turn of a user's conversations, the
memory block every new chat starts with (conversations/prefix_warm.py warms it under the same salt), their
background jobs. The salt is ``HMAC(SECRET_KEY, tenant)`` (Django's ``salted_hmac`` with SHA-256,
64 hex characters, within vLLM's 128-character limit and free of the characters it refuses):
unguessable without the secret key, the same in every process of one deployment (so gateways
and engine processes agree), and changed for every tenant when the secret key rotates.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.utils.crypto import salted_hmac

if TYPE_CHECKING:
    from gateway.gate import Caller

# The HMAC's purpose string (Django's key_salt): no other HMAC of SECRET_KEY in the product
# yields the same value for the same input.
SALT_PURPOSE = "chatsite.gateway.tenancy.cache_salt"


def tenant_of(caller: Caller) -> str:
    """Whose prefix cache ``caller``'s requests use: ``"org:<id>"`` when the caller acts in an
    organisation that shares its cache (``caller.org_shares_cache``), else ``"user:<id>"``."""
    if caller.org_id is not None and caller.org_shares_cache:
        return f"org:{caller.org_id}"
    return f"user:{caller.user_id}"


def cache_salt_for(caller: Caller) -> str:
    """The prefix-cache salt of ``caller``'s tenant (:func:`tenant_of`): 64 lower-case hex
    characters, HMAC-SHA256 keyed by settings.SECRET_KEY. Pure (reads only the secret key);
    the same caller always gets the same salt, two tenants never the same one."""
    return salted_hmac(SALT_PURPOSE, tenant_of(caller), algorithm="sha256").hexdigest()
