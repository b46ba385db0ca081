from django.urls import path

from imports import views

urlpatterns = [
    path("settings/import", views.import_page, name="chats-import"),
]
