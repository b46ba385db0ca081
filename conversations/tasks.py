"""Celery tasks of the conversations app: thin wrappers around services (CONVENTIONS.md).

Celery's autodiscovery imports this module; each task lives beside the service it wraps and is
registered by the import below.
"""
