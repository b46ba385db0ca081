"""User.training_opt_out (issue 20): a person's own training opt-out, beside their
organisation's ``not_for_training``. A database default of false so adding it rewrites no row
(PostgreSQL 11+ keeps a constant default in the catalogue) and older code that inserts users
keeps working. No turn changes: tags are decided when a turn is written."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("accounts", "0010_user_custom_instructions"),
    ]

    operations = [
        migrations.AddField(
            model_name="user",
            name="training_opt_out",
            field=models.BooleanField(default=False, db_default=False),
        ),
    ]
