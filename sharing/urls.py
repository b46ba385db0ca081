"""Sharing routes; included at the site root by chatsite/urls.py: ``path("", include("sharing.urls"))``."""

urlpatterns: list = []
