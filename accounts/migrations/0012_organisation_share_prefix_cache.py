"""Organisation.share_prefix_cache (issue 27): whether the organisation's members share one
prefix cache in the engine (the organisation's cache salt) or each has their own (the default).
A database default of false so adding it rewrites no row and older code that inserts
organisations keeps working."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("accounts", "0011_user_training_opt_out"),
    ]

    operations = [
        migrations.AddField(
            model_name="organisation",
            name="share_prefix_cache",
            field=models.BooleanField(default=False, db_default=False),
        ),
    ]
