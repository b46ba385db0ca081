"""A partial index for a workspace's shared conversations (workspaces/selectors.py), built with
``CREATE INDEX CONCURRENTLY`` so a large conversations table keeps taking writes while it is
built (hence ``atomic = False``, and a migration of its own: a failed concurrent build leaves
an INVALID index that must be dropped before running this again). Only shared rows are
indexed, so it stays small."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ('conversations', '0008_workspace_sharing_training'),
    ]

    operations = [
        AddIndexConcurrently(
            model_name='conversation',
            index=models.Index(condition=models.Q(('shared_with_org', True)), fields=['org', '-last_turn_at'], name='conv_org_shared_recent'),
        ),
    ]
