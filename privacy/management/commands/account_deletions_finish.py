"""``manage.py account_deletions_finish``: complete account deletions that were asked for and
stopped part way (a region's database was down, the process died): privacy/services.py."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from privacy.services import account_deletions_finish


class Command(BaseCommand):
    help = "Complete every unfinished account deletion."

    def handle(self, *args, **options):
        self.stdout.write(f"Completed {account_deletions_finish()} account deletion(s).")
