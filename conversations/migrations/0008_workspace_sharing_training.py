"""Workspaces (issue 8): ``Conversation.shared_with_org`` and ``Turn.training_eligible``.

Both columns get a database default (``db_default``), so PostgreSQL adds them without
rewriting either table (a constant default is stored in the catalogue, PostgreSQL 11+), and
raw-SQL bulk loads that do not name them (partition maintenance moves rows by the parent's
column list, restores) stay valid. ``conversations_turn`` is partitioned by month (migration
0004): ``ALTER TABLE ... ADD COLUMN`` on the partitioned parent adds the column to every
partition, DEFAULT included, and partitions created later (``CREATE TABLE ... PARTITION OF``)
inherit it. Existing turns read ``training_eligible = true``: no organisation had the
not-for-training policy before this migration. Runs unchanged on every region's database
(``migrate --database=region_<name>``): only conversation tables are touched.
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('conversations', '0007_moderation'),
    ]

    operations = [
        migrations.AddField(
            model_name='conversation',
            name='shared_with_org',
            field=models.BooleanField(db_default=False, default=False),
        ),
        migrations.AddField(
            model_name='turn',
            name='training_eligible',
            field=models.BooleanField(db_default=True, default=True),
        ),
    ]
