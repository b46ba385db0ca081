"""``manage.py training_export --output PATH [--since DATE] [--region R]``: write the turns that
may be used for training as JSON Lines in chat format, one conversation a line (privacy/training.py
says what goes out and what never does).

The file is written beside ``PATH`` under a temporary name and renamed onto it at the end, so a
failed run leaves no half-written export (nor any of its lines) behind. ``--since`` takes an ISO
8601 date (``2026-05-01``: from 00:00 UTC that day) or date and time (``2026-05-01T12:00``,
UTC unless it names its offset).
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from core.regions import RegionUnavailable
from privacy.training import training_records


def since_parse(text: str) -> datetime:
    """An aware datetime from ``--since``: an ISO 8601 date (midnight UTC) or date and time (UTC
    unless it carries an offset). Raises CommandError, saying what is expected, otherwise."""
    try:
        moment = datetime.fromisoformat((text or "").strip())  # a bare date is its midnight
    except ValueError:
        raise CommandError(
            f"--since {text!r} is not a date: give YYYY-MM-DD or YYYY-MM-DDTHH:MM[:SS][+HH:MM]."
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


class Command(BaseCommand):
    help = (
        "Write every conversation's training-eligible turns (the branch its page shows) as JSON "
        "Lines in chat format, from every region's database."
    )

    def add_arguments(self, parser):
        parser.add_argument("--output", required=True, metavar="PATH", help="the .jsonl file")
        parser.add_argument(
            "--since", metavar="DATE", help="only exchanges written on or after this date (UTC)"
        )
        parser.add_argument("--region", metavar="R", help="only this region's conversations")

    def handle(self, *args, output: str, since: str | None, region: str | None, **options):
        since_at = since_parse(since) if since is not None else None
        path = Path(output)
        if not path.parent.is_dir():
            raise CommandError(
                f"--output {output!r}: the folder {str(path.parent)!r} does not exist."
            )
        partial = path.with_name(f".{path.name}.partial")
        conversations = messages = 0
        try:
            records = training_records(since=since_at, region=region)
            with partial.open("w", encoding="utf-8") as out:
                for record in records:
                    out.write(json.dumps(record, ensure_ascii=False) + "\n")
                    conversations += 1
                    messages += len(record["messages"])
            os.replace(partial, path)
        except RegionUnavailable as exc:
            raise CommandError(f"--region: {exc.messages[0]}") from None
        except OSError as exc:
            raise CommandError(f"--output {output!r}: {exc.strerror or exc}") from None
        finally:
            partial.unlink(missing_ok=True)
        self.stdout.write(f"Wrote {conversations} conversations ({messages} messages) to {path}.")
