"""Conversation.pinned_at (issue 29 item 8): when the owner pinned the chat to the top of the
sidebar; null for the others. A nullable column: adding it rewrites no row."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('conversations', '0015_conversation_answer_choices'),
    ]

    operations = [
        migrations.AddField(
            model_name='conversation',
            name='pinned_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
