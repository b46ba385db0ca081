"""Memory facts, blocks and extraction markers move to region databases (issue 20 part 1).

The ``memory`` app is regional (``settings.CHAT_REGIONAL_APPS``): facts and blocks live in their
user's home region's database, extraction markers in their conversation's, and this app's
migrations run on every region's database (``migrate --database=region_<name>``). Those
databases have no accounts tables, so the user references lose their database constraint
(0001-0003 were edited to create them without one on a fresh region database; this drops the
constraint where they were created with it). 0001's ``VectorExtension`` (CREATE EXTENSION IF NOT
EXISTS vector) runs on each region's database too: a region server needs pgvector installed.
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
        ("memory", "0003_memory_block"),
    ]

    operations = [
        migrations.AlterField(
            model_name="usermemory",
            name="user",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="memories",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AlterField(
            model_name="extractionmarker",
            name="user",
            field=models.ForeignKey(
                db_constraint=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="memory_extraction_markers",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AlterField(
            model_name="memoryblock",
            name="user",
            field=models.OneToOneField(
                db_constraint=False,
                on_delete=django.db.models.deletion.CASCADE,
                primary_key=True,
                related_name="memory_block",
                serialize=False,
                to=settings.AUTH_USER_MODEL,
            ),
        ),
    ]
