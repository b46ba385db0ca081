"""The conversation tree (issue 18, part 5): Turn.parent (a user message's parent message on its
branch; nullable with no default, so adding it to the partitioned table rewrites nothing, and
old rows keep NULL: conversations/versions.py derives their parent) and
Conversation.branch_choices (the branch last looked at, per fork)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('conversations', '0011_turn_continues'),
    ]

    operations = [
        migrations.AddField(
            model_name='conversation',
            name='branch_choices',
            field=models.JSONField(blank=True, db_default={}, default=dict),
        ),
        migrations.AddField(
            model_name='turn',
            name='parent',
            field=models.ForeignKey(blank=True, db_constraint=False, null=True, on_delete=django.db.models.deletion.DO_NOTHING, related_name='+', to='conversations.turn'),
        ),
    ]
