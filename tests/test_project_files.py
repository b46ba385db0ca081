"""Project files (issue 30 part 2): kinds by content, limits (pages, characters, zip bombs),
passages with exact offsets, retrieval (order, floor, budget, READY files of that project only),
the /v1 files endpoints, and one file read by a real Celery worker. The scripted engine's
tokenizer (one token per word); the real all-MiniLM-L6-v2 embedder; files in a temporary folder."""

from __future__ import annotations

import io
import time
import tracemalloc
import zipfile

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from accounts.services import api_key_create
from bench.project_docs import docx_bomb, docx_from_markdown, pdf_from_text
from chatsite.celery import app
from projects import files as project_files
from projects.chunking import chunk_text
from projects.files import FileRefused, kind_detect, text_extract
from projects.ingest import file_ingest, project_file_delete
from projects.uploads import project_file_add
from projects.models import Project, ProjectFile, ProjectPassage
from projects.retrieval import passages_retrieve
from tests.processes import celery_worker_process

pytestmark = pytest.mark.django_db(transaction=True)

MANUAL = """# Aurora thermostat

## Filters

Change the furnace air filter every 90 days of fan time. Homes with pets should choose 30 days.

## Wi-Fi

The thermostat joins 2.4 GHz networks only; a 5 GHz network is not listed during setup.
"""
RECIPE = "Lentil soup: rinse 250 g of brown lentils, soften an onion, simmer for 40 minutes, salt at the end."


@pytest.fixture(autouse=True)
def media(settings, tmp_path):
    settings.CHAT_PROJECT_FILE_STORAGE = {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": str(tmp_path / "projects")},
    }
    return tmp_path / "projects"


def later() -> float:
    return time.monotonic() + 60


def extract(kind: str, data: bytes, name: str = "f"):
    return text_extract(name=name, kind=kind, data=data, deadline=later())


def project_of(make_user, name="owner") -> Project:
    user = make_user(name)
    return Project.objects.create(owner=user, name="P", region=user.region)


def add(project: Project, name: str, data: bytes) -> ProjectFile:
    """Add a file; its reading runs inline (Celery eager in tests) once the row is committed."""
    return project_file_add(project=project, user=project.owner, upload=SimpleUploadedFile(name, data))


# --- kinds and extraction ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "data", "kind"),
    [
        ("notes.txt", b"plain words\n", "text"),
        ("notes.md", b"# Title\n\nbody\n", "markdown"),
        ("notes.markdown", b"# Title\n", "markdown"),
        ("manual.txt", pdf_from_text("a pdf named txt"), "pdf"),
        ("report.bin", docx_from_markdown("# H\n\nword text"), "docx"),
    ],
)
def test_the_kind_is_judged_by_content(name, data, kind):
    assert kind_detect(name=name, stream=io.BytesIO(data)) == kind


def test_a_zip_that_is_not_a_word_document_is_refused_by_name():
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("photo.jpg", b"x")
    with pytest.raises(FileRefused) as refused:
        kind_detect(name="a.docx", stream=io.BytesIO(archive.getvalue()))
    assert refused.value.status == 415 and "not a Word document" in refused.value.message


def test_binary_data_is_refused_as_what_it_is():
    png = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64
    with pytest.raises(Exception) as refused:
        kind_detect(name="a.md", stream=io.BytesIO(png))
    assert refused.value.status == 415 and "image/png" in refused.value.message


def test_a_pdf_is_extracted_with_its_pages():
    got = extract("pdf", pdf_from_text("first page words\n" + "line\n" * 60 + "last words"))
    assert got.pages == 2 and "first page words" in got.text and "last words" in got.text


def test_a_docx_is_extracted_with_headings_as_markdown():
    got = extract("docx", docx_from_markdown(MANUAL))
    assert got.text.startswith("# Aurora thermostat\n\n## Filters\n\nChange the furnace air filter")
    assert got.pages == 1


def test_markdown_and_text_are_extracted_as_they_are():
    assert extract("markdown", MANUAL.encode()).text == MANUAL
    assert extract("text", b"a\r\nb").text == "a\nb"


def test_a_pdf_over_the_page_cap_is_refused(settings):
    settings.CHAT_PROJECT_FILE_MAX_PAGES = 2
    with pytest.raises(Exception) as refused:
        extract("pdf", pdf_from_text("x\n" * 200))  # 4 pages
    assert refused.value.status == 413 and "at most 2" in refused.value.message


def test_text_over_the_character_cap_is_refused(settings):
    settings.CHAT_PROJECT_FILE_MAX_CHARS = 1000
    with pytest.raises(FileRefused) as refused:
        extract("docx", docx_from_markdown("word " * 400))
    assert refused.value.code == "too_much_text" and "1,000" in refused.value.message


def test_the_deadline_stops_a_pdf_between_pages():
    with pytest.raises(FileRefused) as refused:
        text_extract(name="slow.pdf", kind="pdf", data=pdf_from_text("x\n" * 200), deadline=time.monotonic() - 1)
    assert refused.value.code == "took_too_long"


def test_a_docx_bomb_is_refused_from_its_declared_size_without_inflating(settings):
    settings.CHAT_PROJECT_DOCX_MAX_INFLATED_BYTES = 8 * 1024 * 1024
    bomb = docx_bomb(64 * 1024 * 1024)
    assert len(bomb) < 200_000  # small on the wire
    tracemalloc.start()
    try:
        with pytest.raises(FileRefused) as refused:
            extract("docx", bomb, "bomb.docx")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert refused.value.code == "docx_too_large_inflated" and "zip bomb" in refused.value.message
    assert peak < 2 * 1024 * 1024


def test_a_docx_bomb_with_a_lying_directory_stops_inflating_at_the_cap(settings, monkeypatch):
    """The declared sizes are not trusted: with the directory check off (as if it lied), the
    stream stops at the byte cap, holding one chunk at a time."""
    settings.CHAT_PROJECT_DOCX_MAX_INFLATED_BYTES = 4 * 1024 * 1024
    settings.CHAT_PROJECT_DOCX_MAX_RATIO = 10**9  # only the byte cap can stop it
    monkeypatch.setattr(project_files, "_check_declared", lambda name, infos: None)
    fed = []
    original = project_files._BodyReader.feed
    monkeypatch.setattr(project_files._BodyReader, "feed", lambda self, chunk: (fed.append(len(chunk)), original(self, chunk)))
    tracemalloc.start()
    try:
        with pytest.raises(FileRefused) as refused:
            extract("docx", docx_bomb(64 * 1024 * 1024), "bomb.docx")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "unpacks to more than 4.0 MB" in refused.value.message
    assert sum(fed) <= 4 * 1024 * 1024
    assert peak < 12 * 1024 * 1024  # the text found so far (<= 4 MB) and a chunk, not 64 MB


def test_a_docx_with_a_dtd_is_refused():
    xml = b'<?xml version="1.0"?><!DOCTYPE d [<!ENTITY a "aaaa">]><d>&a;</d>'
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("word/document.xml", xml)
    with pytest.raises(FileRefused) as refused:
        extract("docx", archive.getvalue())
    assert refused.value.code == "docx_unsafe"


# --- chunking ---------------------------------------------------------------------------------


def test_passages_point_back_into_the_text_exactly():
    text = (MANUAL + "\n\n" + "A sentence that goes on. " * 120) * 3
    chunks = chunk_text(text, count_tokens=lambda s: len(s.split()), target_tokens=50, overlap_tokens=10)
    assert len(chunks) > 10
    for chunk in chunks:
        assert text[chunk.start : chunk.end] == chunk.text
        assert chunk.tokens <= 50
    assert [c.ordinal for c in chunks] == list(range(len(chunks)))


def test_a_passage_carries_the_headings_it_sits_under():
    chunks = chunk_text(MANUAL, count_tokens=lambda s: len(s.split()), target_tokens=20, overlap_tokens=0)
    wifi = next(c for c in chunks if "2.4 GHz" in c.text)
    assert wifi.heading.startswith("Aurora thermostat")
    assert wifi.embedding_text().startswith(wifi.heading + "\n\n")


# --- ingest and retrieval ---------------------------------------------------------------------


def test_an_added_file_is_read_into_passages_and_marked_ready(make_user, engine_double, media):
    project = project_of(make_user)
    added = add(project, "manual.md", MANUAL.encode())
    added.refresh_from_db()
    assert added.status == ProjectFile.Status.READY and added.kind == "markdown"
    assert added.chars == len(MANUAL)
    passages = list(ProjectPassage.objects.filter(file=added))
    assert passages and all(MANUAL[p.start : p.end] == p.text for p in passages)
    assert [p.is_file() for p in media.rglob("*") if p.is_file()] == [True]


def test_a_redelivered_file_is_not_read_twice(make_user, engine_double):
    project = project_of(make_user)
    added = add(project, "manual.md", MANUAL.encode())
    count = ProjectPassage.objects.filter(file=added).count()
    ProjectFile.objects.filter(pk=added.pk).update(status=ProjectFile.Status.PENDING)
    file_ingest(file_id=added.pk)
    assert ProjectPassage.objects.filter(file=added).count() == count


def test_a_file_that_cannot_be_read_is_failed_with_the_reason(make_user, engine_double, settings):
    settings.CHAT_PROJECT_FILE_MAX_PAGES = 1
    project = project_of(make_user)
    added = add(project, "long.pdf", pdf_from_text("x\n" * 200))
    added.refresh_from_db()
    assert added.status == ProjectFile.Status.FAILED and "at most 1" in added.error
    assert not ProjectPassage.objects.filter(file=added).exists()


def test_retrieval_orders_by_similarity_and_keeps_only_this_projects_ready_files(make_user, engine_double):
    project = project_of(make_user)
    other = project_of(make_user, "other")
    add(project, "manual.md", MANUAL.encode())
    add(project, "recipe.txt", RECIPE.encode())
    add(other, "other.md", MANUAL.encode())
    pending = add(project, "pending.md", b"The furnace air filter must be changed every 90 days.")
    ProjectFile.objects.filter(pk=pending.pk).update(status=ProjectFile.Status.PENDING)

    found = passages_retrieve(project=project, question="How often do I change the furnace filter?", k=5, min_similarity=-1, budget_tokens=10_000)

    assert found[0].file_name == "manual.md" and "90 days" in found[0].text
    assert [r.similarity for r in found] == sorted((r.similarity for r in found), reverse=True)
    assert {r.file_name for r in found} == {"manual.md", "recipe.txt"}  # not pending, not other's
    assert len(found) == ProjectPassage.objects.filter(project=project, file__status="ready").count()


def test_retrieval_drops_passages_under_the_floor(make_user, engine_double):
    project = project_of(make_user)
    add(project, "manual.md", MANUAL.encode())
    add(project, "recipe.txt", RECIPE.encode())
    question = "How long do I simmer the lentils?"
    everything = passages_retrieve(project=project, question=question, k=10, min_similarity=-1, budget_tokens=10_000)
    floor = (everything[0].similarity + everything[-1].similarity) / 2

    kept = passages_retrieve(project=project, question=question, k=10, min_similarity=floor, budget_tokens=10_000)

    assert 0 < len(kept) < len(everything) and all(r.similarity >= floor for r in kept)


def test_retrieval_keeps_within_the_token_budget(make_user, engine_double):
    project = project_of(make_user)
    add(project, "manual.md", MANUAL.encode())
    add(project, "recipe.txt", RECIPE.encode())
    everything = passages_retrieve(project=project, question="filters", k=10, min_similarity=-1, budget_tokens=10_000)
    budget = everything[0].tokens

    kept = passages_retrieve(project=project, question="filters", k=10, min_similarity=-1, budget_tokens=budget)

    assert kept and sum(r.tokens for r in kept) <= budget and kept[0] == everything[0]


def test_deleting_a_file_removes_its_passages_and_bytes(make_user, engine_double, media):
    project = project_of(make_user)
    added = add(project, "manual.md", MANUAL.encode())
    project_file_delete(file=ProjectFile.objects.get(pk=added.pk))
    assert not ProjectFile.objects.filter(pk=added.pk).exists()
    assert not ProjectPassage.objects.filter(file_id=added.pk).exists()
    assert not [p for p in media.rglob("*") if p.is_file()]


# --- /v1 --------------------------------------------------------------------------------------


def api(user) -> Client:
    return Client(headers={"Authorization": f"Bearer {api_key_create(user=user, name='t').raw}"})


def test_the_owner_adds_lists_and_deletes_files_over_the_api(make_user, engine_double):
    project = project_of(make_user)
    client = api(project.owner)
    url = f"/v1/projects/{project.pk}/files"

    created = client.post(url, {"file": SimpleUploadedFile("manual.md", MANUAL.encode())})
    assert created.status_code == 201, created.content
    assert created.json()["status"] == "pending" and created.json()["kind"] == "markdown"
    listed = client.get(url).json()["files"]
    assert [(f["name"], f["status"]) for f in listed] == [("manual.md", "ready")]
    assert listed[0]["passages"] > 0

    deleted = client.delete(f"{url}/{listed[0]['file_id']}")
    assert deleted.status_code == 204 and client.get(url).json() == {"files": []}


@pytest.mark.parametrize(
    ("data", "status", "type_"),
    [
        (b"", 400, "empty_file"),
        (b"\x89PNG\r\n\x1a\n" + b"\x00" * 64, 415, "unsupported_file_type"),
        (b"x" * 2048, 413, "file_too_large"),
    ],
)
def test_a_refused_upload_gets_a_clear_error_and_stores_nothing(make_user, engine_double, settings, media, data, status, type_):
    settings.CHAT_PROJECT_FILE_MAX_BYTES = 1024
    project = project_of(make_user)
    response = api(project.owner).post(f"/v1/projects/{project.pk}/files", {"file": SimpleUploadedFile("a.txt", data)})
    assert response.status_code == status and response.json()["error"]["type"] == type_
    assert response.json()["error"]["message"]
    assert not ProjectFile.objects.exists() and not [p for p in media.rglob("*") if p.is_file()]


def test_someone_elses_project_is_not_found(make_user, engine_double):
    project = project_of(make_user)
    intruder = api(make_user("intruder"))
    url = f"/v1/projects/{project.pk}/files"
    assert intruder.get(url).status_code == 404
    assert intruder.post(url, {"file": SimpleUploadedFile("a.txt", b"x")}).status_code == 404
    assert not ProjectFile.objects.exists()


def test_a_body_that_is_not_multipart_is_refused(make_user, engine_double):
    project = project_of(make_user)
    response = api(project.owner).post(f"/v1/projects/{project.pk}/files", "{}", content_type="application/json")
    assert response.status_code == 415


# --- a real worker ----------------------------------------------------------------------------


def test_a_real_worker_reads_an_added_docx_into_passages(make_user, tmp_path):
    """Given a real Celery worker on the broker, when a DOCX is added, then the request returns
    at once with the file pending, and the worker (not this process) reads it: READY, passages."""
    project = project_of(make_user)
    app.conf.task_always_eager = False
    try:
        with celery_worker_process(tmp_path, {"CHAT_PROJECT_FILE_ROOT": str(tmp_path / "projects")}) as worker:
            from django.conf import settings  # noqa: PLC0415

            settings.CHAT_PROJECT_FILE_STORAGE = {
                "BACKEND": "django.core.files.storage.FileSystemStorage",
                "OPTIONS": {"location": str(tmp_path / "projects")},
            }
            added = add(project, "manual.docx", docx_from_markdown(MANUAL))
            assert added.status == ProjectFile.Status.PENDING
            deadline = time.monotonic() + 120
            while ProjectFile.objects.get(pk=added.pk).status == ProjectFile.Status.PENDING:
                assert time.monotonic() < deadline, worker.log()[-3000:]
                time.sleep(0.5)
            assert "projects.file_ingest" in worker.log()
    finally:
        app.conf.task_always_eager = True
    done = ProjectFile.objects.get(pk=added.pk)
    assert done.status == ProjectFile.Status.READY, done.error
    assert done.kind == "docx" and ProjectPassage.objects.filter(file=done).exists()


# --- a project's file count and the uploads' rate --------------------------------------------


def test_a_project_at_its_file_cap_refuses_another_with_a_clear_413(make_user, engine_double, settings, media):
    """Given a project holding CHAT_PROJECT_MAX_FILES (2) files, when a third is added over /v1,
    then it is a 413 too_many_files that says the cap and what to do, and nothing is stored;
    once a file is deleted, it is added."""
    settings.CHAT_PROJECT_MAX_FILES = 2
    project = project_of(make_user)
    add(project, "one.md", b"# One\n\nfirst")
    second = add(project, "two.md", b"# Two\n\nsecond")
    client = api(project.owner)
    url = f"/v1/projects/{project.pk}/files"

    refused = client.post(url, {"file": SimpleUploadedFile("three.md", b"third")})

    assert refused.status_code == 413 and refused.json()["error"]["type"] == "too_many_files"
    assert "at most 2" in refused.json()["error"]["message"] and "three.md" in refused.json()["error"]["message"]
    assert ProjectFile.objects.filter(project=project).count() == 2
    assert len([p for p in media.rglob("*") if p.is_file()]) == 2
    project_file_delete(file=second)
    assert client.post(url, {"file": SimpleUploadedFile("three.md", b"third")}).status_code == 201


def test_the_page_says_why_a_file_over_the_cap_was_refused(make_user, engine_double, settings):
    """Given a project at its cap, when the page's form adds a file, then the file list comes
    back with the cap's message (400: every file was refused)."""
    settings.CHAT_PROJECT_MAX_FILES = 1
    project = project_of(make_user)
    add(project, "one.md", b"# One\n\nfirst")
    client = Client()
    client.force_login(project.owner)

    response = client.post(
        f"/p/{project.pk}/files/add", {"files": [SimpleUploadedFile("two.md", b"second")]}, headers={"HX-Request": "true"}
    )

    assert response.status_code == 400
    assert "a project can hold at most 1" in response.content.decode()
    assert ProjectFile.objects.filter(project=project).count() == 1


def test_api_uploads_count_against_the_callers_rpm(make_user, engine_double, settings):
    """Given an RPM of 2, when a third upload comes within the minute, then it is a 429
    rate_limited with Retry-After, and only two files were stored."""
    settings.CHAT_RATE_LIMITS_BY_TIER = {"free": {"rpm": 2, "tpm": 1_000_000}}
    project = project_of(make_user, name="rpm-api")
    client = api(project.owner)
    url = f"/v1/projects/{project.pk}/files"

    codes = [client.post(url, {"file": SimpleUploadedFile(f"{i}.md", b"words")}).status_code for i in range(2)]
    third = client.post(url, {"file": SimpleUploadedFile("3.md", b"words")})

    assert codes == [201, 201]
    assert third.status_code == 429 and third.json()["error"]["type"] == "rate_limited"
    assert int(third["Retry-After"]) >= 1
    assert ProjectFile.objects.filter(project=project).count() == 2


def test_page_uploads_count_against_the_users_rpm(make_user, engine_double, settings):
    """Given an RPM of 1, when the page's form adds files twice within the minute, then the
    second request is a 429 whose file list says to slow down, and it stored nothing."""
    settings.CHAT_RATE_LIMITS_BY_TIER = {"free": {"rpm": 1, "tpm": 1_000_000}}
    project = project_of(make_user, name="rpm-page")
    client = Client()
    client.force_login(project.owner)
    url = f"/p/{project.pk}/files/add"

    first = client.post(url, {"files": [SimpleUploadedFile("a.md", b"words")]}, headers={"HX-Request": "true"})
    second = client.post(url, {"files": [SimpleUploadedFile("b.md", b"words")]}, headers={"HX-Request": "true"})

    assert first.status_code == 200
    assert second.status_code == 429 and "Slow down" in second.content.decode() and second["Retry-After"]
    assert list(ProjectFile.objects.filter(project=project).values_list("name", flat=True)) == ["a.md"]
