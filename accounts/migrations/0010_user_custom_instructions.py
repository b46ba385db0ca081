"""User.custom_instructions (issue 18): the user's instructions for every chat. A database
default of "" so adding it rewrites no row and older code that inserts users keeps working."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("accounts", "0009_user_theme"),
    ]

    operations = [
        migrations.AddField(
            model_name="user",
            name="custom_instructions",
            field=models.TextField(blank=True, default="", db_default=""),
        ),
    ]
