"""Workspaces routes; included at the site root by chatsite/urls.py: ``path("", include("workspaces.urls"))``."""

from django.urls import path

from workspaces import audit_views, views

urlpatterns = [
    path("orgs/", views.org_list, name="org-list"),
    path("orgs/<slug:slug>/", views.org_overview, name="org-overview"),
    path("orgs/<slug:slug>/conversations/", views.org_conversations, name="org-conversations"),
    path("orgs/<slug:slug>/members/", views.org_members, name="org-members"),
    path(
        "orgs/<slug:slug>/members/<int:user_id>/remove",
        views.member_remove,
        name="org-member-remove",
    ),
    path("orgs/<slug:slug>/members/<int:user_id>/role", views.member_role, name="org-member-role"),
    path("orgs/<slug:slug>/leave", views.org_leave, name="org-leave"),
    path("orgs/<slug:slug>/invitations/", views.org_invitations, name="org-invitations"),
    path(
        "orgs/<slug:slug>/invitations/<int:invitation_id>/revoke",
        views.invitation_revoke,
        name="org-invitation-revoke",
    ),
    path("orgs/<slug:slug>/policies/", views.org_policies, name="org-policies"),
    path("orgs/<slug:slug>/audit/", audit_views.org_audit, name="org-audit"),
    path("invitations/<str:token>/", views.invitation_accept, name="invitation-accept"),
    path(
        "c/<uuid:conversation_id>/workspace",
        views.conversation_share,
        name="conversation-workspace",
    ),
]
