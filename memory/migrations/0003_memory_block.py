# The per-user memory block (memory/models.py MemoryBlock; memory/blocks.py), issue 19 part 3.

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0010_user_custom_instructions"),
        ("memory", "0002_extraction_marker"),
    ]

    operations = [
        migrations.CreateModel(
            name="MemoryBlock",
            fields=[
                (
                    "user",
                    models.OneToOneField(
                        db_constraint=False,  # edited after the fact, see 0004
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="memory_block",
                        serialize=False,
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
                ("version", models.BigIntegerField(default=0)),
                ("built_version", models.BigIntegerField(default=-1)),
                ("text", models.TextField(blank=True, default="")),
                ("token_count", models.PositiveIntegerField(default=0)),
                ("budget", models.PositiveIntegerField(default=0)),
                ("overflow", models.BooleanField(default=False)),
                ("built_at", models.DateTimeField(blank=True, null=True)),
            ],
            options={
                "db_table": "memory_block",
            },
        ),
    ]
