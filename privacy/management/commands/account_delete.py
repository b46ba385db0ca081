"""``manage.py account_delete USERNAME``: delete an account and its data everywhere, for staff
handling a deletion request (privacy/services.py). ``--allow-ownerless`` deletes even the last
owner of an organisation (it is left without an owner: give it one in the admin)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from accounts.models import Membership, User
from privacy import services


class Command(BaseCommand):
    help = "Delete an account and all its data in every region (usage kept anonymised)."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument(
            "--by",
            metavar="STAFF_USERNAME",
            help="the staff member handling the request (audit log)",
        )
        parser.add_argument(
            "--allow-ownerless",
            action="store_true",
            help="delete even the last owner of an organisation",
        )

    def handle(self, *args, username: str, allow_ownerless: bool, by: str | None = None, **options):
        user = User.objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"No account {username!r}.")
        staff = None
        if by:
            staff = User.objects.filter(username=by, is_staff=True).first()
            if staff is None:
                raise CommandError(f"No staff account {by!r}.")
        if allow_ownerless:
            # Demoting them first lets the deletion through; the organisation keeps its members.
            Membership.objects.filter(user=user, role=Membership.Role.OWNER).update(
                role=Membership.Role.MEMBER
            )
        try:
            counts = services.account_delete(user=user, requested_by=staff)
        except services.DeletionBlocked as exc:
            raise CommandError(f"{exc.messages[0]} (or pass --allow-ownerless)") from None
        summary = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in counts.items())
        self.stdout.write(f"Deleted account #{user.pk}: {summary}.")
