"""Attachments routes; included at the site root by chatsite/urls.py: ``path("", include("attachments.urls"))``.

Files are uploaded with the message in the chat page (conversations/turn_views.py ``turn_create``,
multipart), or through ``/v1`` before the turn that sends them."""

from django.urls import path

from attachments import api, views

urlpatterns = [
    path("v1/conversations/<uuid:conversation_id>/attachments", api.attachments, name="v1-attachments"),
    path(
        "c/<uuid:conversation_id>/attachments/<uuid:attachment_id>",
        views.attachment_download,
        name="attachment-download",
    ),
]
