"""Privacy routes; included at the site root by chatsite/urls.py (``include("privacy.urls")``)."""

from django.urls import path

from privacy import api, views

urlpatterns = [
    path("settings/data/", views.data_page, name="privacy-data"),
    path("settings/data/export", views.data_export, name="privacy-export"),
    path("settings/delete-account/", views.account_delete, name="account-delete"),
    path("account-deleted/", views.account_deleted, name="account-deleted"),
    path("c/<uuid:conversation_id>/export.<str:extension>", views.conversation_export, name="conversation-export"),
    path("orgs/<slug:slug>/export/", views.org_export, name="org-export"),
    path("orgs/<slug:slug>/delete/", views.org_delete, name="org-delete"),
    path("v1/users/<int:user_id>/export", api.user_export, name="v1-user-export"),
]
