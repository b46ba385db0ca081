"""Audit routes; included at the site root by chatsite/urls.py (``include("audit.urls")``)."""

from django.urls import path

from audit import views

urlpatterns = [
    path("orgs/<slug:slug>/audit/", views.org_audit, name="org-audit"),
]
