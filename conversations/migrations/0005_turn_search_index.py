"""A GIN index for full-text search over turn text (search_selectors.conversation_search).

Created on the partitioned parent, so PostgreSQL builds one on every partition and on every
partition created later. The expression is Django's ``SearchVector("content", config="english")``
(``to_tsvector('english'::regconfig, COALESCE(content, ''))``); queries must use the same one.
"""

import django.contrib.postgres.indexes
import django.contrib.postgres.search
from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('conversations', '0004_turn_partitioning'),
    ]

    operations = [
        migrations.AddIndex(
            model_name='turn',
            index=django.contrib.postgres.indexes.GinIndex(django.contrib.postgres.search.SearchVector('content', config='english'), name='turn_content_fts'),
        ),
    ]
