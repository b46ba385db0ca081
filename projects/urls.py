from django.urls import path

from projects import views

urlpatterns = [
    path("projects/new", views.project_new, name="project-new"),
    path("projects/sidebar", views.sidebar_projects, name="sidebar-projects"),
    path("p/<uuid:project_id>/", views.project_detail, name="project"),
    path("p/<uuid:project_id>/rename", views.project_rename, name="project-rename"),
    path("p/<uuid:project_id>/instructions", views.project_instructions, name="project-instructions"),
    path("p/<uuid:project_id>/files", views.project_files, name="project-files"),
    path("p/<uuid:project_id>/files/add", views.project_files_add, name="project-files-add"),
    path(
        "p/<uuid:project_id>/files/<uuid:file_id>/delete",
        views.project_file_delete,
        name="project-file-delete",
    ),
    path("p/<uuid:project_id>/delete", views.project_delete, name="project-delete"),
]
