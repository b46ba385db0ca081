"""Ledger rows that name a conversation move to its region's database (issue 20 part 1).

The ``usage`` app is regional (``settings.CHAT_REGIONAL_APPS``), so its migrations run on every
region's database (``migrate --database=region_<name>``), which has no accounts tables: the user
and organisation references lose their database constraint (0001 was edited to create them
without one on a fresh region database; this drops it where 0001 made it).
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
        ("accounts", "0001_initial"),
        ("usage", "0002_blocked_status"),
    ]

    operations = [
        migrations.AlterField(
            model_name="usagerecord",
            name="org",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="usage_records",
                to="accounts.organisation",
            ),
        ),
        migrations.AlterField(
            model_name="usagerecord",
            name="user",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="usage_records",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
    ]
