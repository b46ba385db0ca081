"""Feedback routes; included at the site root by chatsite/urls.py: ``path("", include("feedback.urls"))``."""

urlpatterns: list = []
