"""Usage and account settings pages; included at the site root by chatsite/urls.py."""

from django.urls import path

from usage import views

urlpatterns = [
    path("usage/", views.usage_page, name="usage"),
    path("orgs/<slug:slug>/usage/", views.org_usage_page, name="org-usage"),
    path("settings/", views.account_settings, name="settings"),
]
