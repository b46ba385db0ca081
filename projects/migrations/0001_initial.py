"""Projects (issue 30): projects, their files and the files' passages with embeddings (pgvector,
the extension memory 0001 creates)."""

import django.db.models.deletion
import django.utils.timezone
import pgvector.django.vector
import uuid
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('accounts', '0012_organisation_share_prefix_cache'),
        ('memory', '0006_block_retrievable'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='Project',
            fields=[
                ('project_id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ('name', models.CharField(max_length=120)),
                ('instructions', models.TextField(blank=True)),
                ('region', models.CharField(max_length=32)),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('updated_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('org', models.ForeignKey(blank=True, db_constraint=False, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='projects', to='accounts.organisation')),
                ('owner', models.ForeignKey(db_constraint=False, on_delete=django.db.models.deletion.CASCADE, related_name='projects', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'ordering': ['-updated_at'],
            },
        ),
        migrations.CreateModel(
            name='ProjectFile',
            fields=[
                ('file_id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ('name', models.CharField(max_length=255)),
                ('kind', models.CharField(choices=[('text', 'Text'), ('markdown', 'Markdown'), ('pdf', 'PDF'), ('docx', 'Word document')], max_length=16)),
                ('size', models.PositiveBigIntegerField()),
                ('sha256', models.CharField(max_length=64)),
                ('storage_name', models.CharField(max_length=255)),
                ('status', models.CharField(choices=[('pending', 'Reading'), ('ready', 'Ready'), ('failed', 'Could not be read')], default='pending', max_length=16)),
                ('error', models.TextField(blank=True)),
                ('pages', models.PositiveIntegerField(blank=True, null=True)),
                ('chars', models.PositiveIntegerField(default=0)),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('ready_at', models.DateTimeField(blank=True, null=True)),
                ('project', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='files', to='projects.project')),
                ('uploaded_by', models.ForeignKey(db_constraint=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'ordering': ['created_at'],
            },
        ),
        migrations.CreateModel(
            name='ProjectPassage',
            fields=[
                ('passage_id', models.BigAutoField(primary_key=True, serialize=False)),
                ('ordinal', models.PositiveIntegerField()),
                ('start', models.PositiveIntegerField()),
                ('end', models.PositiveIntegerField()),
                ('text', models.TextField()),
                ('tokens', models.PositiveIntegerField()),
                ('embedding', pgvector.django.vector.VectorField(dimensions=384)),
                ('file', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='passages', to='projects.projectfile')),
                ('project', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='passages', to='projects.project')),
            ],
            options={
                'ordering': ['file_id', 'ordinal'],
            },
        ),
        migrations.AddIndex(
            model_name='project',
            index=models.Index(fields=['owner', 'updated_at'], name='project_owner_updated'),
        ),
        migrations.AddIndex(
            model_name='project',
            index=models.Index(fields=['org', 'updated_at'], name='project_org_updated'),
        ),
        migrations.AddIndex(
            model_name='projectfile',
            index=models.Index(fields=['project', 'created_at'], name='project_file_created'),
        ),
        migrations.AddIndex(
            model_name='projectpassage',
            index=models.Index(fields=['project', 'file'], name='project_passage_project'),
        ),
    ]
