"""Turn.finish_reason: why an answer ended (stop, length, cancelled, moderation, error), so a
stored answer's terminal event says it too (issue 17) and a cut-off answer can be continued.
A database default of '' as for ``pool``: adding it to the partitioned table rewrites nothing
(PostgreSQL 11+ stores a constant default in the catalogue)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("conversations", "0009_conversation_org_shared_index"),
    ]

    operations = [
        migrations.AddField(
            model_name="turn",
            name="finish_reason",
            field=models.CharField(blank=True, db_default="", default="", max_length=16),
        ),
    ]
