"""The Celery app (broker: the same Redis as the cache).

``make run`` starts a worker and beat beside the server (chatsite/devstack.py); by hand::

    celery -A chatsite worker -l INFO
    celery -A chatsite beat -l INFO

Configuration comes from the ``CELERY_*`` Django settings (chatsite/settings/base.py): late
acknowledgement, requeue on worker loss, prefetch 1, and the beat schedule.
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.base")

app = Celery("chatsite")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
