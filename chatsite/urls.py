from django.contrib import admin
from django.urls import include, path

from accounts import views as account_views
from chatsite import health
from conversations import conversation_views, page_views, stream_views, turn_views, version_views
from workspaces import views as workspace_views

# Styled pages with a way back; /v1 paths get its JSON error shape (chatsite/error_pages.py).
handler403 = "chatsite.error_pages.permission_denied"
handler404 = "chatsite.error_pages.page_not_found"
handler500 = "chatsite.error_pages.server_error"

urlpatterns = [
    path("", page_views.home, name="home"),
    path("chat/turns", turn_views.turn_create, name="turn-create-new"),
    # A conversation another member shared with a workspace is read on the workspaces' page.
    path(
        "c/<uuid:conversation_id>/",
        page_views.conversation_detail,
        {"shared_page": workspace_views.shared_conversation_page},
        name="conversation",
    ),
    path("c/<uuid:conversation_id>/turns", turn_views.turn_create, name="turn-create"),
    path(
        "c/<uuid:conversation_id>/earlier",
        page_views.conversation_earlier,
        name="conversation-earlier",
    ),
    path(
        "c/<uuid:conversation_id>/turns/<uuid:turn_id>/events",
        stream_views.turn_events,
        name="turn-events",
    ),
    path(
        "c/<uuid:conversation_id>/turns/<uuid:turn_id>/stop",
        stream_views.turn_stop,
        name="turn-stop",
    ),
    path(
        "c/<uuid:conversation_id>/turns/<uuid:turn_id>/edit",
        turn_views.turn_edit,
        name="turn-edit",
    ),
    path(
        "c/<uuid:conversation_id>/turns/<uuid:turn_id>/regenerate",
        version_views.answer_regenerate,
        name="answer-regenerate",
    ),
    path(
        "c/<uuid:conversation_id>/turns/<uuid:turn_id>/continue",
        version_views.answer_continue,
        name="answer-continue",
    ),
    path(
        "c/<uuid:conversation_id>/turns/<uuid:turn_id>/version",
        version_views.answer_version,
        name="answer-version",
    ),
    path(
        "c/<uuid:conversation_id>/turns/<uuid:turn_id>/select",
        version_views.question_select,
        name="question-select",
    ),
    path(
        "c/<uuid:conversation_id>/rename",
        conversation_views.conversation_rename,
        name="conversation-rename",
    ),
    path(
        "c/<uuid:conversation_id>/pin",
        conversation_views.conversation_pin,
        name="conversation-pin",
    ),
    path(
        "c/<uuid:conversation_id>/delete",
        conversation_views.conversation_delete,
        name="conversation-delete",
    ),
    path(
        "c/<uuid:conversation_id>/instructions",
        conversation_views.conversation_instructions,
        name="conversation-instructions",
    ),
    path(
        "c/<uuid:conversation_id>/discard",
        conversation_views.conversation_discard,
        name="conversation-discard",
    ),
    path("search", conversation_views.conversation_search, name="conversation-search"),
    path("settings/api-keys/", account_views.api_keys, name="api-keys"),
    path(
        "settings/api-keys/<int:key_id>/revoke",
        account_views.api_key_revoke,
        name="api-key-revoke",
    ),
    # Sign-in (throttled), sign-up, password reset and change, sessions, OIDC when on.
    path("", include("accounts.urls")),
    path("admin/", admin.site.urls),
    path("v1/", include("api.urls")),
    path("", include("usage.urls")),
    path("", include("moderation.urls")),
    path("", include("memory.urls")),
    path("", include("workspaces.urls")),
    path("", include("sharing.urls")),
    path("", include("attachments.urls")),
    path("", include("feedback.urls")),
    path("", include("privacy.urls")),
    path("", include("imports.urls")),
    path("", include("projects.urls")),
    path("metrics", health.metrics_view, name="metrics"),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
]
