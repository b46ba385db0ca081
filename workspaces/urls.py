"""Workspaces routes; included at the site root by chatsite/urls.py: ``path("", include("workspaces.urls"))``."""

urlpatterns: list = []
