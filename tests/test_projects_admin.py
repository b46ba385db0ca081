"""Projects in the admin (issue 30, projects/admin.py): listed per region, read-only, the
owner's content (instructions) never shown, and a deletion goes through the services (a
project's chats and files go with it). Real PostgreSQL; one region."""

from __future__ import annotations

import pytest
from django.test import Client

from conversations.models import Conversation
from projects.models import Project, ProjectFile
from tests.projects_support import project_chat_with_sources

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def staff(django_user_model) -> Client:
    client = Client()
    client.force_login(django_user_model.objects.create_superuser("root", "root@example.org", "pw-Secret-123"))
    return client


def test_projects_and_files_are_listed_without_their_content(make_user, staff):
    """Given a project with instructions and a file, then both admin lists show them by name,
    and neither the list nor the change page shows the instructions' text."""
    owner = make_user("olive")
    project, _chat, _answer = project_chat_with_sources(owner, name="Antares")
    Project.objects.filter(pk=project.pk).update(instructions="Secret launch codes: 1234")
    file = ProjectFile.objects.get(project=project)

    listed = staff.get("/admin/projects/project/").content.decode()
    change = staff.get(f"/admin/projects/project/{project.pk}/change/").content.decode()
    files = staff.get("/admin/projects/projectfile/").content.decode()
    searched = staff.get("/admin/projects/project/", {"q": "olive"}).content.decode()

    assert "Antares" in listed and "Antares" in searched
    assert "Secret launch codes" not in change and "Antares" in change
    assert "mission.md" in files and staff.get(f"/admin/projects/projectfile/{file.pk}/change/").status_code == 200


def test_nothing_is_added_or_changed_in_the_admin(make_user, staff):
    """Given a project, then there is no add page and its change page saves nothing."""
    project, _chat, _answer = project_chat_with_sources(make_user("olive"))

    assert staff.get("/admin/projects/project/add/").status_code == 403
    staff.post(f"/admin/projects/project/{project.pk}/change/", {"name": "Renamed"})
    assert Project.objects.get(pk=project.pk).name == "Antares"


def test_deleting_a_project_in_the_admin_deletes_its_chats_and_files(make_user, staff):
    """Given a project with a chat and a file, when staff delete it, then the chat and the file
    are gone with it (projects/services.py projects_delete)."""
    project, chat, _answer = project_chat_with_sources(make_user("olive"))

    response = staff.post(f"/admin/projects/project/{project.pk}/delete/", {"post": "yes"})

    assert response.status_code == 302
    assert not Project.objects.filter(pk=project.pk).exists()
    assert not Conversation.objects.filter(pk=chat.pk).exists()
    assert not ProjectFile.objects.filter(project_id=project.pk).exists()
