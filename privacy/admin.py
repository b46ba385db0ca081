"""A user deleted in the admin is deleted the way its owner would delete the account
(privacy.services.account_delete), never by the admin's own cascade.

The user admin is the accounts app's (accounts/admin.py); this app, which owns the deletion
workflow, replaces its registration with a subclass that adds the deletion, so accounts imports
nothing of privacy.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.shortcuts import redirect
from django.urls import reverse

from accounts.admin import UserAdmin
from accounts.models import User
from privacy.selectors import last_owner_orgs
from privacy.services import DeletionBlocked, account_delete

admin.site.unregister(User)


@admin.register(User)
class AccountDeletionUserAdmin(UserAdmin):
    """accounts/admin.py's ``UserAdmin``, deleting through the account's deletion service."""

    def delete_view(self, request, object_id, extra_context=None):
        """Refuse, with the reason, to delete the last owner of an organisation (an organisation
        always keeps an owner: privacy.services.DeletionBlocked says what to do first)."""
        if request.method == "POST":
            user = self.get_object(request, object_id)
            blockers = last_owner_orgs(user=user) if user is not None else []
            if blockers:
                self.message_user(request, DeletionBlocked(blockers).messages[0], messages.ERROR)
                return redirect(reverse("admin:accounts_user_change", args=[user.pk]))
        return super().delete_view(request, object_id, extra_context)

    def get_deleted_objects(self, objs, request):
        """The confirmation page's list, without Django's per-row permission check on related
        rows: API keys, usage and the audit log are read-only in the admin by design, and the
        account's deletion service (not the admin's cascade) decides what happens to them."""
        deleted, counts, _perms_needed, protected = super().get_deleted_objects(objs, request)
        return deleted, counts, set(), protected

    def delete_model(self, request, obj: User) -> None:
        """Delete the account the way its owner would (privacy.services.account_delete): data in
        every region's database, files, keys, links, sessions ended, usage anonymised, audited
        with the staff member as requester."""
        account_delete(user=obj, requested_by=request.user)

    def delete_queryset(self, request, queryset) -> None:
        """As :meth:`delete_model` for each selected account; the last owner of an organisation
        is left alone and named in an error message."""
        for user in queryset:
            try:
                account_delete(user=user, requested_by=request.user)
            except DeletionBlocked as exc:
                self.message_user(request, f"{user.username}: {exc.messages[0]}", messages.ERROR)
