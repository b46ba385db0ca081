"""The Celery app (broker: the same Redis as the cache). Workers: ``celery -A chatsite worker``."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.base")

app = Celery("chatsite")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
