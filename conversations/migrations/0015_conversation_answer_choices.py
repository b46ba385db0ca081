"""Conversation.answer_choices (issue 29): the answer version last looked at, per question, so a
reload and another device show the same ``< i/n >``. A column with a database default: adding it
rewrites no row."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('conversations', '0014_conversation_temporary'),
    ]

    operations = [
        migrations.AddField(
            model_name='conversation',
            name='answer_choices',
            field=models.JSONField(blank=True, db_default={}, default=dict),
        ),
    ]
