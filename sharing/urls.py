"""Sharing routes; included at the site root by chatsite/urls.py: ``path("", include("sharing.urls"))``."""

from django.urls import path

from sharing import views

urlpatterns = [
    # The owner's pages.
    path("c/<uuid:conversation_id>/share/", views.share_manage, name="share-manage"),
    path(
        "c/<uuid:conversation_id>/share/<uuid:link_id>/update",
        views.share_update,
        name="share-update",
    ),
    path(
        "c/<uuid:conversation_id>/share/<uuid:link_id>/revoke",
        views.share_revoke,
        name="share-revoke",
    ),
    path("settings/shared-links/", views.shared_links, name="shared-links"),
    # The public pages (the token: sharing/tokens.py; a malformed one is a 404 page).
    path("s/<str:token>/", views.shared, name="shared"),
    path("s/<str:token>/continue", views.shared_continue, name="shared-continue"),
]
