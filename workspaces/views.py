"""Workspace pages: your organisations (and creating one), an organisation's overview, shared
conversations, members, invitations and policies, accepting an invitation, sharing a
conversation with the workspace, and a shared conversation read by a member.

Thin: parse, call a selector or service, render. Who may do what: workspaces/selectors.py.
Anonymous visitors are sent to sign in (as on every page); a signed-in person who is not a
member gets 404 for every organisation URL (its existence is not revealed); a member lacking
the role gets 403 with the reason.
"""

from __future__ import annotations

import functools
from uuid import UUID

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from conversations import selectors as conversation_selectors
from conversations.models import Conversation, Turn
from core.redirects import next_on_site
from core.rendering import markdown_to_safe_html
from workspaces import invitations, selectors, services
from workspaces.forms import InvitationForm, OrganisationCreateForm, PolicyForm, org_tier_limits


def _refusals_as_pages(view):
    """Render PermissionDenied from a selector or service as a 403 page with its reason
    (Django's default 403 page shows none)."""

    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        try:
            return view(request, *args, **kwargs)
        except PermissionDenied as exc:
            return _message_page(
                request, "Not allowed", str(exc) or "You may not do that here.", 403
            )

    return wrapper


def _message_page(
    request: HttpRequest, title: str, message: str, status: int, org=None
) -> HttpResponse:
    return render(
        request,
        "workspaces/message.html",
        {"title": title, "message": message, "org": org},
        status=status,
    )


def _see_other(url: str) -> HttpResponse:
    response = redirect(url)
    response.status_code = 303
    return response


def _nav(seat: selectors.Seat, current: str) -> dict:
    return {"seat": seat, "org": seat.org, "current": current}


# --- your organisations -----------------------------------------------------------------------


@require_http_methods(["GET", "POST"])
@login_required
def org_list(request: HttpRequest) -> HttpResponse:
    """``GET``: the organisations you belong to, with your role, and a form to create one.
    ``POST``: create one (you become its owner) and go to it (303); 400 with the form's
    errors for a bad name, URL name or region, or a URL name already taken."""
    status = 200
    if request.method == "POST":
        form = OrganisationCreateForm(request.POST, user=request.user)
        if form.is_valid():
            try:
                org = services.organisation_create(
                    creator=request.user,
                    name=form.cleaned_data["name"],
                    slug=form.cleaned_data["slug"],
                    region=form.cleaned_data["region"],
                )
            except ValidationError as exc:
                form.add_error("slug" if exc.code == "slug_taken" else None, exc)
            else:
                messages.success(request, f"{org.name} is created; you are its owner.")
                return _see_other(reverse("org-overview", args=[org.slug]))
        status = 400
    else:
        form = OrganisationCreateForm(user=request.user)
    context = {"seats": selectors.seats_of(user=request.user), "form": form}
    return render(request, "workspaces/org_list.html", context, status=status)


# --- one organisation -------------------------------------------------------------------------


@require_GET
@login_required
def org_overview(request: HttpRequest, slug: str) -> HttpResponse:
    """An organisation as its members see it: your role, its policies in force, the members'
    count and what you can do there. Members of any role; 404 for everyone else."""
    seat = selectors.seat_get(slug=slug, user=request.user)
    tier_limits = org_tier_limits(seat.org)
    own = {"rpm": seat.org.rate_limit_rpm, "tpm": seat.org.rate_limit_tpm}
    context = {
        **_nav(seat, "overview"),
        "member_count": len(selectors.member_list(org=seat.org)),
        # What applies: the organisation's own limit, else its tier's (None: unlimited).
        "limits": {k: own[k] if own[k] is not None else tier_limits[k] for k in own},
        "tier_retention_days": conversation_selectors.retention_days_for_tier(seat.org.tier),
    }
    return render(request, "workspaces/org_overview.html", context)


@require_GET
@login_required
def org_conversations(request: HttpRequest, slug: str) -> HttpResponse:
    """The conversations shared with the workspace (read-only for everyone but their owner),
    and your own conversations in it that are not shared, each with a Share button.
    Members of any role; 404 for everyone else."""
    seat = selectors.seat_get(slug=slug, user=request.user)
    context = {
        **_nav(seat, "conversations"),
        "shared": selectors.shared_conversation_list(org=seat.org),
        "unshared": selectors.own_unshared_list(org=seat.org, user=request.user),
    }
    return render(request, "workspaces/org_conversations.html", context)


@require_GET
@login_required
def org_members(request: HttpRequest, slug: str) -> HttpResponse:
    """The members and their roles. Everyone in the organisation sees the list; owners and
    admins get Remove buttons (admins for plain members), owners role pickers. 404 for
    non-members."""
    seat = selectors.seat_get(slug=slug, user=request.user)
    members = [
        {"membership": m, "can_remove": seat.can_remove(m), "is_you": m.user_id == request.user.pk}
        for m in selectors.member_list(org=seat.org)
    ]
    context = {**_nav(seat, "members"), "members": members, "roles": selectors.Role.choices}
    return render(request, "workspaces/org_members.html", context)


@require_POST
@login_required
@_refusals_as_pages
def member_remove(request: HttpRequest, slug: str, user_id: int) -> HttpResponse:
    """Remove member ``user_id``: their access ends with this request. Owners and admins
    (admins: plain members only, 403 otherwise); 404 for non-members or an unknown member;
    400 for the last owner or yourself (use Leave)."""
    seat = selectors.seat_get_managing_members(slug=slug, user=request.user)
    membership = selectors.membership_get(org=seat.org, user_id=user_id)
    try:
        services.member_remove(seat=seat, membership=membership)
    except ValidationError as exc:
        return _message_page(request, "Not removed", exc.messages[0], 400, seat.org)
    messages.success(request, f"{membership.user.username} is no longer a member.")
    return _see_other(reverse("org-members", args=[seat.org.slug]))


@require_POST
@login_required
@_refusals_as_pages
def member_role(request: HttpRequest, slug: str, user_id: int) -> HttpResponse:
    """Set member ``user_id``'s role (``role``: owner, admin or member). Owners only (403 for
    admins and members, 404 for non-members); 400 for an unknown role or the last owner."""
    seat = selectors.seat_get_owning(slug=slug, user=request.user)
    membership = selectors.membership_get(org=seat.org, user_id=user_id)
    try:
        changed = services.member_role_set(
            seat=seat, membership=membership, role=request.POST.get("role", "")
        )
    except ValidationError as exc:
        return _message_page(request, "Role not changed", exc.messages[0], 400, seat.org)
    messages.success(
        request, f"{changed.user.username} is now {changed.get_role_display().lower()}."
    )
    return _see_other(reverse("org-members", args=[seat.org.slug]))


@require_POST
@login_required
def org_leave(request: HttpRequest, slug: str) -> HttpResponse:
    """Leave the organisation (members of any role; 404 for non-members); 400 for its only
    owner. Back to your organisations."""
    seat = selectors.seat_get(slug=slug, user=request.user)
    try:
        services.member_leave(seat=seat)
    except ValidationError as exc:
        return _message_page(request, "You are still a member", exc.messages[0], 400, seat.org)
    messages.success(request, f"You left {seat.org.name}.")
    return _see_other(reverse("org-list"))


# --- invitations ------------------------------------------------------------------------------


def _accept_url(request: HttpRequest, token: str) -> str:
    return request.build_absolute_uri(reverse("invitation-accept", args=[token]))


@require_http_methods(["GET", "POST"])
@login_required
@_refusals_as_pages
def org_invitations(request: HttpRequest, slug: str) -> HttpResponse:
    """``GET``: pending invitations and the form. ``POST`` (``email`` blank for a link,
    ``role``): create one; an email invitation is sent through Django's mail API. The new link
    is shown once on the response (201; never stored, so it is not shown again). 400 with the
    form's errors for a bad address or role, a member's address or one already invited.
    Owners and admins (admins invite as member only); 403 for members, 404 for non-members."""
    seat = selectors.seat_get_managing_members(slug=slug, user=request.user)
    status, issued, link, emailed = 200, None, "", None
    if request.method == "POST":
        form = InvitationForm(request.POST, seat=seat)
        if form.is_valid():
            try:
                issued = invitations.invitation_create(
                    seat=seat, role=form.cleaned_data["role"], email=form.cleaned_data["email"]
                )
            except ValidationError as exc:  # a member's address, or one already invited
                form.add_error("email", exc)
        if issued is not None:
            link = _accept_url(request, issued.token)
            if issued.invitation.email:
                emailed = invitations.invitation_email_send(issued=issued, accept_url=link)
            form = InvitationForm(seat=seat)
            status = 201
        else:
            status = 400
    else:
        form = InvitationForm(seat=seat)
    context = {
        **_nav(seat, "invitations"),
        "form": form,
        "pending": selectors.invitation_list_pending(org=seat.org),
        "issued": issued,
        "link": link,
        "emailed": emailed,
    }
    response = render(request, "workspaces/org_invitations.html", context, status=status)
    response["Cache-Control"] = "no-store"  # the page may hold a working invitation link
    return response


@require_POST
@login_required
@_refusals_as_pages
def invitation_revoke(request: HttpRequest, slug: str, invitation_id: int) -> HttpResponse:
    """Withdraw an invitation: its link stops working at once. Owners and admins; 403 for
    members; 404 for non-members and for another organisation's invitation."""
    seat = selectors.seat_get_managing_members(slug=slug, user=request.user)
    invitation = selectors.invitation_get_for_org(org=seat.org, invitation_id=invitation_id)
    invitations.invitation_revoke(seat=seat, invitation=invitation)
    messages.success(request, "The invitation is withdrawn; its link no longer works.")
    return _see_other(reverse("org-invitations", args=[seat.org.slug]))


@require_http_methods(["GET", "POST"])
@login_required
def invitation_accept(request: HttpRequest, token: str) -> HttpResponse:
    """``GET``: what the invitation is (organisation, role, who sent it) with an Accept button.
    ``POST``: accept it: you join with its role and go to the organisation (303).
    Anonymous visitors are sent to sign in and come back here. Refusals are pages saying what
    to do: 404 unknown link; 410 withdrawn, used or expired; 403 an invitation for another
    email address; 409 already a member."""
    try:
        invitation = invitations.invitation_find(token=token)
        if request.method == "POST":
            membership = invitations.invitation_accept(token=token, user=request.user)
            messages.success(
                request,
                f"Welcome to {membership.organisation.name}. You joined as {membership.role}.",
            )
            return _see_other(reverse("org-overview", args=[membership.organisation.slug]))
        problem = invitations.invitation_problem(invitation=invitation, user=request.user)
        if problem is not None:
            raise problem
    except invitations.InvitationRefused as exc:
        response = _message_page(request, "Invitation", exc.message, exc.status)
        response["Cache-Control"] = "no-store"
        return response
    response = render(
        request, "workspaces/invitation_accept.html", {"invitation": invitation, "token": token}
    )
    response["Cache-Control"] = "no-store"
    return response


# --- policies ---------------------------------------------------------------------------------


@require_http_methods(["GET", "POST"])
@login_required
@_refusals_as_pages
def org_policies(request: HttpRequest, slug: str) -> HttpResponse:
    """``GET``: the policies as a form. ``POST``: validate and save them (303 back with a
    confirmation); they apply from the next turn. 400 with the errors for invalid values
    (e.g. a rate limit above the tier's). Owners only: 403 for admins and members (they see
    the policies on the overview), 404 for non-members."""
    seat = selectors.seat_get_owning(slug=slug, user=request.user)
    status = 200
    if request.method == "POST":
        form = PolicyForm(request.POST, org=seat.org)
        if form.is_valid():
            services.organisation_policy_update(seat=seat, changes=form.changes())
            messages.success(request, "Saved. The policies apply from the next message.")
            return _see_other(reverse("org-policies", args=[seat.org.slug]))
        status = 400
    else:
        form = PolicyForm(org=seat.org)
    return render(
        request,
        "workspaces/org_policies.html",
        {**_nav(seat, "policies"), "form": form},
        status=status,
    )


# --- conversations ----------------------------------------------------------------------------


@require_POST
@login_required
def conversation_share(request: HttpRequest, conversation_id: UUID) -> HttpResponse:
    """Share your conversation with its organisation's workspace (``shared=1``) or stop
    (``shared=0``). 404 if it is not yours; 400 if it is in no workspace or you left its
    organisation. Back to ``next`` (a path on this site) or the conversation (303)."""
    conversation = conversation_selectors.conversation_get_for_user(
        conversation_id=conversation_id, user=request.user
    )
    shared = request.POST.get("shared") == "1"
    try:
        services.conversation_share_set(conversation=conversation, user=request.user, shared=shared)
    except ValidationError as exc:
        return _message_page(request, "Not shared", exc.messages[0], 400)
    messages.success(
        request,
        "Shared with the workspace: its members can read it."
        if shared
        else "No longer shared with the workspace.",
    )
    target = next_on_site(request, request.POST.get("next", ""))
    return _see_other(target or reverse("conversation", args=[conversation.conversation_id]))


def shared_conversation_page(request: HttpRequest, conversation: Conversation) -> HttpResponse:
    """A conversation shared with a workspace, as another member reads it: every exchange
    (newest version of each message and answer), no message box, no edit, regenerate or stop.
    ``conversation`` comes from ``conversations.selectors.conversation_view_for_user``
    (``conversations.page_views.conversation_detail`` calls it for non-owners: chatsite/urls.py
    passes it in)."""
    exchanges = [
        {
            "question": x.question,
            "answer": x.answer,
            "answer_html": markdown_to_safe_html(x.answer.content) if x.answer else "",
        }
        for x in conversation_selectors.exchange_list(conversation=conversation)
        # A message the input gate stopped never reached the model and its text was flagged:
        # it is not passed on to the workspace (nor to share links, sharing/selectors.py).
        if x.question is not None and x.question.status != Turn.Status.BLOCKED
    ]
    org = conversation.org
    owner = conversation.owner
    context = {"conversation": conversation, "exchanges": exchanges, "org": org, "owner": owner}
    return render(request, "workspaces/shared_conversation.html", context)
