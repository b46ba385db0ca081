"""Turn.continues: an answer written by Continue names the cut-off answer it continues (issue
18). Nullable with no default: adding it to the partitioned table rewrites nothing."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("conversations", "0010_turn_finish_reason"),
    ]

    operations = [
        migrations.AddField(
            model_name="turn",
            name="continues",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                null=True,
                on_delete=django.db.models.deletion.DO_NOTHING,
                related_name="+",
                to="conversations.turn",
            ),
        ),
    ]
