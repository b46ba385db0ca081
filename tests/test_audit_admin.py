"""The audit log and the Django admin (issue 10): the admin's one-object changes are mirrored
from its LogEntry (field names only, never objects' names), its bulk actions are recorded once
per selected row (audit/middleware.py), a confirmation page records nothing, and the audit log
itself is read-only in the admin."""

from __future__ import annotations

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.test import Client

from accounts.models import ApiKey, Membership
from accounts.services import api_key_create
from audit.models import AuditEntry
from audit.services import audit_record
from workspaces import services

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(make_user) -> Client:
    staff = make_user("root", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(staff)
    client.staff = staff
    return client


@pytest.fixture
def acme(make_user):
    olga, mia, max_ = (make_user(n) for n in ("olga", "mia", "max"))
    org = services.organisation_create(creator=olga, name="Acme", slug="acme")
    return {
        "org": org,
        "mia": Membership.objects.create(organisation=org, user=mia, role="member"),
        "max": Membership.objects.create(organisation=org, user=max_, role="member"),
    }


def admin_entries() -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(action__startswith="admin.").order_by("id"))


def test_a_change_through_an_admin_form_is_recorded_with_the_changed_fields(admin_client, acme):
    """Given a membership, when staff change its role on its admin page, then one
    ``admin.change`` entry names the staff member, the row, the field changed and the
    organisation (so its owners see it), and no one's name."""
    membership = acme["mia"]

    response = admin_client.post(
        f"/admin/accounts/membership/{membership.pk}/change/",
        {"user": membership.user_id, "organisation": membership.organisation_id, "role": "admin"},
    )

    assert response.status_code == 302, response.content[:500]
    (entry,) = admin_entries()
    assert (entry.action, entry.actor_id, entry.org_id) == (
        "admin.change",
        admin_client.staff.pk,
        acme["org"].pk,
    )
    assert (entry.target_type, entry.target_id) == ("accounts.membership", str(membership.pk))
    assert entry.details == {"via": "admin", "fields": ["Role"]}
    assert "mia" not in str(entry.details)


def test_deleting_one_row_from_its_page_is_recorded(admin_client, acme):
    membership = acme["max"]

    admin_client.post(f"/admin/accounts/membership/{membership.pk}/delete/", {"post": "yes"})

    (entry,) = admin_entries()
    assert (entry.action, entry.target_id, entry.org_id) == (
        "admin.delete",
        str(membership.pk),
        acme["org"].pk,
    )


def test_a_bulk_action_is_recorded_once_per_selected_row(admin_client, make_user):
    """Given two API keys, when staff run "Revoke the selected API keys", then one
    ``admin.action.revoke`` entry per key, by the staff member, and nothing else."""
    user = make_user("kim")
    keys = [api_key_create(user=user, name=f"k{i}").api_key for i in range(2)]

    response = admin_client.post(
        "/admin/accounts/apikey/",
        {"action": "revoke", ACTION_CHECKBOX_NAME: [k.pk for k in keys], "index": 0},
    )

    assert response.status_code == 302
    assert ApiKey.objects.filter(revoked_at__isnull=False).count() == 2
    recorded = admin_entries()
    assert [(e.action, e.target_type, e.actor_id) for e in recorded] == [
        ("admin.action.revoke", "accounts.apikey", admin_client.staff.pk)
    ] * 2
    assert {e.target_id for e in recorded} == {str(k.pk) for k in keys}


def test_delete_selected_records_each_row_once_and_its_confirmation_page_nothing(
    admin_client, acme
):
    """Given two memberships, when staff choose "Delete selected" (a confirmation page), then
    nothing is recorded yet; when they confirm, one ``admin.action.delete_selected`` entry per
    row with its organisation, and no second ``admin.delete`` copy (the admin's LogEntry of a
    bulk deletion is not mirrored while the action runs)."""
    ids = [acme["mia"].pk, acme["max"].pk]
    form = {"action": "delete_selected", ACTION_CHECKBOX_NAME: ids}

    confirmation = admin_client.post("/admin/accounts/membership/", {**form, "index": 0})
    after_confirmation_page = admin_entries()
    done = admin_client.post("/admin/accounts/membership/", {**form, "post": "yes"})

    assert confirmation.status_code == 200 and after_confirmation_page == []
    assert done.status_code == 302 and not Membership.objects.filter(pk__in=ids).exists()
    recorded = admin_entries()
    assert sorted((e.action, e.target_id, e.org_id) for e in recorded) == sorted(
        ("admin.action.delete_selected", str(pk), acme["org"].pk) for pk in ids
    )


def test_an_action_with_nothing_selected_records_nothing(admin_client):
    response = admin_client.post("/admin/accounts/apikey/", {"action": "revoke", "index": 0})

    assert response.status_code == 302
    assert admin_entries() == []


def test_the_audit_log_is_listed_for_staff(admin_client):
    audit_record(
        actor=None,
        action="org.policy_change",
        target_type="accounts.organisation",
        target_id=1,
        details={},
    )

    response = admin_client.get("/admin/audit/auditentry/")

    assert response.status_code == 200 and b"org.policy_change" in response.content


def test_the_audit_log_cannot_be_changed_or_deleted_in_the_admin(admin_client):
    entry = audit_record(
        actor=None,
        action="org.policy_change",
        target_type="accounts.organisation",
        target_id=1,
        details={},
    )

    view = admin_client.get(f"/admin/audit/auditentry/{entry.pk}/change/")
    change = admin_client.post(
        f"/admin/audit/auditentry/{entry.pk}/change/", {"action": "org.delete"}
    )
    delete = admin_client.post(f"/admin/audit/auditentry/{entry.pk}/delete/", {"post": "yes"})
    add = admin_client.get("/admin/audit/auditentry/add/")

    assert view.status_code == 200 and b'name="action"' not in view.content
    assert change.status_code == 403 and delete.status_code == 403 and add.status_code == 403
    assert AuditEntry.objects.get(pk=entry.pk).action == "org.policy_change"


def test_a_search_by_number_finds_an_actors_entries(admin_client, make_user):
    actor = make_user("sam")
    audit_record(
        actor=actor,
        action="org.policy_change",
        target_type="accounts.organisation",
        target_id=999,
        details={},
    )
    audit_record(
        actor=None,
        action="org.create",
        target_type="accounts.organisation",
        target_id=998,
        details={},
    )

    page = admin_client.get(f"/admin/audit/auditentry/?q={actor.pk}").content.decode()

    assert 'field-action">org.policy_change<' in page and 'field-action">org.create<' not in page
