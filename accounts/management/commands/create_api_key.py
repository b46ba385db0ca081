from django.core.management.base import BaseCommand, CommandError

from accounts.models import User
from accounts.services import api_key_create


class Command(BaseCommand):
    help = "Print a new API key for a user (shown once; only its hash is stored)."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", default="created from the command line")

    def handle(self, *args, username: str, name: str, **options):
        try:
            user = User.objects.get(username=username)
        except User.DoesNotExist:
            raise CommandError(f"No user named {username!r}.") from None
        issued = api_key_create(user=user, name=name)
        self.stdout.write(issued.raw)
