"""Files that a careless client or a damaged disk sends (attachments and project files): each gets
a clear 4xx on the request, or a clear FAILED state with a reason from the worker, and deleting a
project file (or its project) through any entrypoint removes its stored bytes. Scripted engine
double; files in a temporary folder per test."""

from __future__ import annotations

import io
import threading
import zipfile

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connections
from django.test import Client

from accounts.services import api_key_create
from bench.project_docs import docx_from_markdown
from projects import ingest, services
from projects.models import Project, ProjectFile, ProjectPassage
from projects.uploads import project_file_add

pytestmark = pytest.mark.django_db(transaction=True)

BODY = "# Manual\n\n" + "The pump is primed by opening the bleed valve for ten seconds. " * 40


@pytest.fixture(autouse=True)
def media(settings, tmp_path):
    """Project files and attachments in folders of this test's own."""
    settings.CHAT_PROJECT_FILE_STORAGE = {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": str(tmp_path / "projects")},
    }
    settings.CHAT_ATTACHMENT_STORAGE = {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": str(tmp_path / "attachments")},
    }
    return tmp_path


def stored(folder) -> list:
    return [p for p in folder.rglob("*") if p.is_file()] if folder.exists() else []


def project_of(make_user, name="owner") -> Project:
    user = make_user(name)
    return Project.objects.create(owner=user, name="P", region=user.region)


def api(user) -> Client:
    return Client(headers={"Authorization": f"Bearer {api_key_create(user=user, name='t').raw}"})


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _body_offset(data: bytes) -> int:
    """Where word/document.xml's compressed bytes start in the .docx ``data``."""
    info = zipfile.ZipFile(io.BytesIO(data)).getinfo("word/document.xml")
    name_length = int.from_bytes(data[info.header_offset + 26 : info.header_offset + 28], "little")
    extra_length = int.from_bytes(data[info.header_offset + 28 : info.header_offset + 30], "little")
    return info.header_offset + 30 + name_length + extra_length


def docx_with_corrupt_deflate() -> bytes:
    """A .docx whose central directory is intact but whose document.xml's deflate stream is not
    (a disk or transfer error): a block header no inflater accepts (BTYPE 11, "reserved")."""
    data = bytearray(docx_from_markdown(BODY))
    start = _body_offset(bytes(data))
    data[start : start + 8] = b"\xff" * 8
    return bytes(data)


def docx_with_a_directory_past_its_place() -> bytes:
    """A .docx whose end record says the central directory starts 1 MB later than it does (a
    badly patched archive): zipfile lists its names, then cannot seek to any entry."""
    data = bytearray(docx_from_markdown(BODY))
    end = data.rindex(b"PK\x05\x06")
    offset = int.from_bytes(data[end + 16 : end + 20], "little")
    data[end + 16 : end + 20] = (offset + 1024 * 1024).to_bytes(4, "little")
    return bytes(data)


def zip_of_unknown_version() -> bytes:
    """A ZIP whose central directory says it needs a ZIP version from the future (25.0):
    Python's zipfile raises NotImplementedError while reading the directory."""
    data = bytearray(docx_from_markdown(BODY))
    at = data.find(b"PK\x01\x02")
    while at >= 0:
        data[at + 6 : at + 8] = (250).to_bytes(2, "little")  # version needed to extract
        at = data.find(b"PK\x01\x02", at + 4)
    return bytes(data)


# --- project files: damaged archives ---------------------------------------------------------


def test_a_zip_of_an_unknown_version_is_refused_with_a_4xx_not_a_500(make_user, engine_double, media):
    """Given a .docx whose central directory names an unknown ZIP version, when added over /v1
    and on the page, then a 415 naming the file, and nothing is stored."""
    project = project_of(make_user)
    data = zip_of_unknown_version()

    response = api(project.owner).post(f"/v1/projects/{project.pk}/files", {"file": SimpleUploadedFile("report.docx", data)})
    page = signed_in(project.owner).post(
        f"/p/{project.pk}/files/add", {"files": SimpleUploadedFile("report.docx", data)}, headers={"HX-Request": "true"}
    )

    assert response.status_code == 415, response.content
    assert "report.docx" in response.json()["error"]["message"]
    assert page.status_code == 400 and "report.docx" in page.content.decode()
    assert not ProjectFile.objects.exists() and not stored(media)


@pytest.mark.parametrize("make", [docx_with_corrupt_deflate, docx_with_a_directory_past_its_place])
def test_a_damaged_docx_fails_as_damaged_not_as_our_error(make_user, engine_double, make):
    """Given a .docx whose directory reads but whose body does not inflate (or sits at an
    offset before the file), when the worker reads it, then it is FAILED saying the file looks
    damaged, not "an error on our side"."""
    project = project_of(make_user)
    added = project_file_add(project=project, user=project.owner, upload=SimpleUploadedFile("manual.docx", make()))
    added.refresh_from_db()
    assert added.status == ProjectFile.Status.FAILED
    assert "looks damaged" in added.error and "our side" not in added.error


# --- project files: deleting removes the stored bytes ----------------------------------------


def test_deleting_a_file_on_the_project_page_removes_its_bytes(make_user, engine_double, media):
    """Given a project with a stored file, when its owner deletes it on the page, then the row
    and the bytes under the projects' storage are gone."""
    project = project_of(make_user)
    added = project_file_add(project=project, user=project.owner, upload=SimpleUploadedFile("m.md", BODY.encode()))
    assert len(stored(media / "projects")) == 1

    response = signed_in(project.owner).post(f"/p/{project.pk}/files/{added.pk}/delete")

    assert response.status_code == 302
    assert not ProjectFile.objects.exists()
    assert not stored(media / "projects")


def test_deleting_a_project_removes_its_files_bytes(make_user, engine_double, media):
    """Given a project with a stored file, when it is deleted over /v1, then the bytes under
    the projects' storage are gone with it."""
    project = project_of(make_user)
    project_file_add(project=project, user=project.owner, upload=SimpleUploadedFile("m.md", BODY.encode()))
    assert len(stored(media / "projects")) == 1

    response = api(project.owner).delete(f"/v1/projects/{project.pk}")

    assert response.status_code == 204
    assert not Project.objects.exists() and not stored(media / "projects")


def test_deleting_a_project_while_the_worker_stores_its_file_is_not_an_error(make_user, engine_double, monkeypatch):
    """Given a worker inside the transaction that stores a file's passages, when the project is
    deleted meanwhile, then the deletion waits for it and succeeds (no IntegrityError from the
    passages it could not see), and nothing of the project is left."""
    project = project_of(make_user)
    added = project_file_add(project=project, user=project.owner, upload=SimpleUploadedFile("m.md", BODY.encode()))
    ProjectFile.objects.filter(pk=added.pk).update(status=ProjectFile.Status.PENDING)  # a redelivery
    storing, go = threading.Event(), threading.Event()
    now = ingest.timezone.now

    class Paused:  # ingest's clock, read after the passages are written, before the commit
        @staticmethod
        def now():
            storing.set()
            go.wait(10)
            return now()

    monkeypatch.setattr(ingest, "timezone", Paused)

    def read():
        try:
            ingest.file_ingest(file_id=added.pk)
        finally:
            connections.close_all()

    worker = threading.Thread(target=read)
    worker.start()
    assert storing.wait(30)
    threading.Timer(0.5, go.set).start()  # the deletion below is waiting on the worker by then
    try:
        services.project_delete(project=project)
    finally:
        go.set()
        worker.join(30)
    assert not Project.objects.exists() and not ProjectPassage.objects.exists()
