"""Feedback routes; included at the site root by chatsite/urls.py: ``path("", include("feedback.urls"))``."""

from django.urls import path

from feedback import api, views

urlpatterns = [
    path(
        "c/<uuid:conversation_id>/turns/<uuid:turn_id>/feedback",
        views.answer_feedback,
        name="answer-feedback",
    ),
    path(
        "v1/conversations/<uuid:conversation_id>/turns/<uuid:turn_id>/feedback",
        api.answer_feedback,
        name="v1-answer-feedback",
    ),
]
