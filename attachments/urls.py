"""Attachments routes; included at the site root by chatsite/urls.py: ``path("", include("attachments.urls"))``."""

urlpatterns: list = []
