"""Turn.tool_calls and Turn.tool_call_id (issue 30): an answer's function calls and the call a
``tool`` turn answers. Database defaults, as for ``finish_reason`` (0010): adding them to the
partitioned turn log rewrites no row (PostgreSQL 11+ keeps a constant default in the catalogue)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('conversations', '0017_conversation_project'),
    ]

    operations = [
        migrations.AddField(
            model_name='turn',
            name='tool_call_id',
            field=models.CharField(blank=True, db_default='', default='', max_length=200),
        ),
        migrations.AddField(
            model_name='turn',
            name='tool_calls',
            field=models.JSONField(blank=True, db_default=[], default=list),
        ),
    ]
