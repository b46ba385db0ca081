"""Moderation pages; included at the site root by chatsite/urls.py."""

from django.urls import path

from moderation import views

urlpatterns = [
    path("orgs/<slug:slug>/moderation/", views.org_moderation_page, name="org-moderation"),
    path("orgs/<slug:slug>/moderation/review/", views.org_review_page, name="org-moderation-review"),
    path("orgs/<slug:slug>/moderation/review/<uuid:review_id>/fine/", views.org_review_fine,
         name="org-moderation-review-fine"),
]
