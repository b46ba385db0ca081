"""Memory routes; included at the site root by chatsite/urls.py: ``path("", include("memory.urls"))``."""

from django.urls import path

from memory import api, views

urlpatterns = [
    path("v1/users/<int:user_id>/memory", api.user_memory, name="v1-user-memory"),
    path("settings/memory/", views.memory_page, name="memory-settings"),
    path("settings/memory/duplicate", views.memory_page_duplicate, name="memory-settings-duplicate"),
    path("settings/memory/<uuid:fact_id>/delete", views.memory_delete, name="memory-delete"),
    path("settings/memory/clear", views.memory_clear, name="memory-clear"),
    path("settings/memory/toggle", views.memory_toggle, name="memory-toggle"),
    path("memory/updates/<uuid:update_id>/undo", views.memory_update_undo, name="memory-update-undo"),
]
