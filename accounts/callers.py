"""Who a request is for, as the gateway sees it: a user's :class:`gateway.gate.Caller`.

The gateway (gateway/) reads no account model: the entrypoints and jobs build the caller here
from the account and hand it over as values (the tier, the organisation whose limits, pin,
moderation policy and prefix-cache sharing apply, feature flags, whether it is the service
credential). Every request reads the account and organisation afresh, so a change to either
applies from the next one.
"""

from __future__ import annotations

from asgiref.sync import sync_to_async

from accounts.models import Membership, Organisation, User
from accounts.services import user_is_service
from gateway.gate import Caller
from gateway.tenancy import cache_salt_for
from moderation.verdicts import policy_for


def caller_for(user: User, org: Organisation | None = None) -> Caller:
    """The :class:`Caller` for ``user`` acting in ``org`` (the conversation's workspace; None:
    the user's first organisation by joining date, if any, as a new conversation's home is
    chosen, core/regions.py ``home_region``). Sync (ORM: one query for the membership
    when ``org`` is None); use :func:`acaller_for` from async code."""
    if org is None:
        membership = (
            Membership.objects.filter(user_id=user.pk).select_related("organisation").order_by("joined_at").first()
        )
        org = membership.organisation if membership is not None else None
    return Caller(
        user_id=user.pk,
        tier=user.tier,
        org_id=org.pk if org is not None else None,
        org_tier=org.tier if org is not None else None,
        org_pin=(org.pinned_pool or "") if org is not None else "",
        flags=frozenset(user.feature_flags or ()),
        service=user_is_service(user),
        moderation=policy_for(org),
        org_rpm=org.rate_limit_rpm if org is not None else None,
        org_tpm=org.rate_limit_tpm if org is not None else None,
        org_shares_cache=bool(org.share_prefix_cache) if org is not None else False,
    )


acaller_for = sync_to_async(caller_for)


async def acaller_of(conversation, caller: Caller | None = None) -> Caller:
    """``caller``, or the conversation's owner acting in the conversation's organisation
    (:func:`caller_for`, on a worker thread)."""
    if caller is not None:
        return caller
    return await sync_to_async(lambda: caller_for(conversation.owner, conversation.org))()


def user_cache_salt(user: User, org: Organisation | None = None) -> str:
    """The prefix-cache salt of ``user`` acting in ``org`` (gateway/tenancy.py ``cache_salt_for``
    of :func:`caller_for`): what a background job on the user's data sends with its requests,
    so it reads and fills the same cache as the user's own turns. Sync (ORM)."""
    return cache_salt_for(caller_for(user, org))
