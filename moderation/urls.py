"""Moderation pages; included at the site root by chatsite/urls.py."""

from django.urls import path

from moderation import views

urlpatterns = [
    path("orgs/<slug:slug>/moderation/", views.org_moderation_page, name="org-moderation"),
]
