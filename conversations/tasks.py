"""Celery tasks of the conversations app: thin wrappers around services (CONVENTIONS.md).

Celery's autodiscovery imports this module; each task lives beside the service it wraps and is
registered by the import below.
"""

from conversations import retention, writeback  # noqa: E402,F401 - turn_write_back(_sweep), conversations_purge_expired
from conversations import partitions  # noqa: E402,F401 - turn_partitions_ensure
from conversations import summaries  # noqa: E402,F401 - conversation_summarise
