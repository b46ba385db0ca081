"""Conversation.temporary (issue 18): a user's temporary chat, kept nowhere at rest. A database
default of false: adding it rewrites no row. Runs unchanged on every region's database."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("conversations", "0013_turn_latency"),
    ]

    operations = [
        migrations.AddField(
            model_name="conversation",
            name="temporary",
            field=models.BooleanField(db_default=False, default=False),
        ),
    ]
