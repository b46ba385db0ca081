from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from conversations.partitions import (
    DEFAULT_PARTITION,
    turn_log_databases,
    turn_partitions_ensure,
    turn_partitions_list,
)


class Command(BaseCommand):
    help = (
        "Create the turn log's missing monthly partitions in every region's database, from this "
        "month to N months ahead (rows DEFAULT holds for those months move into them)."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--months-ahead",
            type=int,
            default=settings.CHAT_TURN_PARTITIONS_AHEAD,
            help="months after the current one (default: CHAT_TURN_PARTITIONS_AHEAD, %(default)s)",
        )

    def handle(self, *args, months_ahead: int, **options):
        if months_ahead < 0:
            raise CommandError("--months-ahead must be 0 or more.")
        for alias in turn_log_databases():
            created = turn_partitions_ensure(months_ahead=months_ahead, using=alias)
            for name in created:
                self.stdout.write(f"{alias}: created {name}")
            if not created:
                self.stdout.write(f"{alias}: no partition missing")
            monthly = [n for n in turn_partitions_list(using=alias) if n != DEFAULT_PARTITION]
            if monthly:
                self.stdout.write(
                    f"{alias}: {len(monthly)} monthly partitions, {monthly[0]} .. {monthly[-1]}"
                )
