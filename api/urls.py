from django.urls import path

from api import completions, embeddings, openapi, projects, views
from imports import views as import_views
from projects import api as project_api

urlpatterns = [
    path("conversations", views.conversations, name="v1-conversations"),
    path("conversations/<uuid:conversation_id>", views.conversation_detail, name="v1-conversation"),
    path("conversations/<uuid:conversation_id>/turns", views.turns, name="v1-turns"),
    path(
        "conversations/<uuid:conversation_id>/turns/<uuid:turn_id>/events",
        views.turn_events,
        name="v1-turn-events",
    ),
    path(
        "conversations/<uuid:conversation_id>/turns/<uuid:turn_id>/regenerate",
        views.turn_regenerate,
        name="v1-turn-regenerate",
    ),
    path("conversations/<uuid:conversation_id>/cancel", views.cancel, name="v1-cancel"),
    path("chat/completions", completions.chat_completions, name="v1-chat-completions"),
    path("completions", completions.completions, name="v1-completions"),
    path("models", completions.models, name="v1-models"),
    path("embeddings", embeddings.create_embeddings, name="v1-embeddings"),
    path("imports", import_views.import_api, name="v1-imports"),
    path("projects", projects.projects, name="v1-projects"),
    path("projects/<uuid:project_id>", projects.project_detail, name="v1-project"),
    path("projects/<uuid:project_id>/files", project_api.project_files, name="v1-project-files"),
    path(
        "projects/<uuid:project_id>/files/<uuid:file_id>",
        project_api.project_file,
        name="v1-project-file",
    ),
    path("openapi.json", openapi.openapi_document, name="v1-openapi"),
]
