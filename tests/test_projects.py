"""Projects (issue 30): who may open and change a project, its chats, the project's
instructions and passages in a turn's prompt, the answer's sources, deletion and export, /v1.
The scripted engine double answers; embeddings are the real model's. Retrieval and ingestion are
projects/ingest.py and projects/retrieval.py."""

from __future__ import annotations

import json
import uuid
import zipfile

import pytest
from asgiref.sync import sync_to_async
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.test import AsyncClient, Client

from accounts.models import Membership
from conversations import retention, services
from conversations.models import Conversation, Turn
from privacy.export import user_export_build
from privacy.services import account_delete
from projects import selectors as project_selectors
from projects import services as project_services
from projects.models import Project, ProjectFile, ProjectPassage, ProjectTurnSource
from projects.prompt import passage_block, passages_fitted
from projects.sources import sources_by_answer
from projects.retrieval import Retrieved
from tests.projects_support import ingest, passage_file_add, retrieval  # noqa: F401 - fixtures
from tests.api_support import api_client, post_json
from tests.chat_support import HTMX, events_url_of, read_stream
from workspaces import services as workspace_services

pytestmark = pytest.mark.django_db(transaction=True)

INSTRUCTIONS = "Answer as a ship navigator; keep it short."
LAUNCH = "The launch code for the Antares mission is tangerine-42."
WEATHER = "Sourdough bread needs a long, cool fermentation in the fridge."


@pytest.fixture(autouse=True)
def _patient_moderation(settings):
    settings.CHAT_MODERATION_TIMEOUT_S = 10


@pytest.fixture
def prompts(engine_double, monkeypatch) -> list[list[dict]]:
    """Every chat prompt turn assembly tokenized, as messages."""
    seen: list[list[dict]] = []
    encode = engine_double.encode_chat
    monkeypatch.setattr(engine_double, "encode_chat", lambda m: seen.append(list(m)) or encode(m))
    return seen


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def workspace(make_user):
    """An organisation: ``owner`` (its creator), ``admin``, ``member``; and its project."""
    owner, admin, member = make_user("olive"), make_user("adam"), make_user("mia")
    org = workspace_services.organisation_create(creator=owner, name="Acme", slug="acme")
    Membership.objects.create(organisation=org, user=admin, role=Membership.Role.ADMIN)
    Membership.objects.create(organisation=org, user=member, role=Membership.Role.MEMBER)
    project = project_services.project_create(owner=owner, name="Voyage", instructions=INSTRUCTIONS)
    return org, owner, admin, member, project


# --- services and permissions -----------------------------------------------------------------


def test_a_project_is_created_in_its_owners_region_with_an_id_naming_it(make_user):
    """Given a person in no organisation, when they create a project, then it is personal, in
    their region's database, and its id names that region (so reads by id go straight there)."""
    alice = make_user("alice")
    project = project_services.project_create(owner=alice, name="  Thesis  ", instructions=" Be terse. ")
    assert (project.name, project.instructions, project.org_id, project.region) == ("Thesis", "Be terse.", None, alice.region)
    from core.regions import region_of_id  # noqa: PLC0415

    assert region_of_id(project.pk) == alice.region
    assert [p.pk for p in project_selectors.project_list(user=alice)] == [project.pk]


def test_a_member_of_an_organisation_makes_workspace_projects(make_user):
    org, owner, _admin, member, project = workspace(make_user)
    assert project.org_id == org.pk
    assert project.region == org.region
    assert project.pk in [p.pk for p in project_selectors.project_list(user=member)]


def test_someone_elses_project_is_not_found(make_user):
    alice, bob = make_user("alice"), make_user("bob")
    project = project_services.project_create(owner=alice, name="Mine")
    with pytest.raises(Http404):
        project_selectors.project_get_for_user(project_id=project.pk, user=bob)
    assert client_for(bob).get(f"/p/{project.pk}/").status_code == 404
    assert client_for(bob).post(f"/p/{project.pk}/instructions", {"instructions": "x"}).status_code == 404
    assert project_selectors.project_list(user=bob) == []


def test_a_member_opens_a_workspace_project_but_may_not_change_it(make_user):
    """Given a plain member of the project's organisation, then they open it (page 200, its
    instructions shown), and changing it is a 403; nothing changes."""
    _org, _owner, _admin, member, project = workspace(make_user)
    page = client_for(member).get(f"/p/{project.pk}/")
    assert page.status_code == 200
    assert INSTRUCTIONS in page.content.decode()
    assert 'name="instructions"' not in page.content.decode()  # read-only for them
    response = client_for(member).post(f"/p/{project.pk}/instructions", {"instructions": "pwned"})
    assert response.status_code == 403
    assert Project.objects.get(pk=project.pk).instructions == INSTRUCTIONS


def test_an_org_admin_changes_a_members_workspace_project(make_user):
    _org, _owner, admin, _member, project = workspace(make_user)
    response = client_for(admin).post(f"/p/{project.pk}/instructions", {"instructions": "Use metric units."}, headers=HTMX)
    assert response.status_code == 200
    assert Project.objects.get(pk=project.pk).instructions == "Use metric units."


def test_a_member_who_leaves_loses_the_project_at_once(make_user):
    org, _owner, _admin, member, project = workspace(make_user)
    assert project_selectors.project_get_for_user(project_id=project.pk, user=member)
    Membership.objects.filter(organisation=org, user=member).delete()
    with pytest.raises(Http404):
        project_selectors.project_get_for_user(project_id=project.pk, user=member)
    assert client_for(member).get(f"/p/{project.pk}/").status_code == 404
    assert project_selectors.project_list(user=member) == []


def test_an_outsider_and_a_member_differ_404_and_403_on_editing(make_user):
    _org, _owner, _admin, member, project = workspace(make_user)
    outsider = make_user("otto")
    with pytest.raises(PermissionDenied):
        project_selectors.project_get_for_editing(project_id=project.pk, user=member)
    with pytest.raises(Http404):
        project_selectors.project_get_for_editing(project_id=project.pk, user=outsider)


def test_bad_names_and_instructions_are_refused(make_user):
    alice = make_user("alice")
    project = project_services.project_create(owner=alice, name="Ok")
    response = client_for(alice).post(f"/p/{project.pk}/rename", {"name": "   "}, headers=HTMX)
    assert response.status_code == 400
    assert "needs a name" in response.content.decode()
    response = client_for(alice).post(f"/p/{project.pk}/instructions", {"instructions": "x" * 8001}, headers=HTMX)
    assert response.status_code == 400
    assert Project.objects.get(pk=project.pk).name == "Ok"


# --- pages ------------------------------------------------------------------------------------


def test_new_project_page_creates_one_and_the_sidebar_lists_it(make_user):
    alice = make_user("alice")
    client = client_for(alice)
    response = client.post("/projects/new", {"name": "Garden"})
    project = Project.objects.get(owner=alice)
    assert response.status_code == 302 and response["Location"] == f"/p/{project.pk}/"
    home = client.get("/").content.decode()
    assert "Garden" in home and f"/p/{project.pk}/" in home and "New project" in home


def test_a_new_chat_from_the_project_page_is_in_the_project_not_in_the_main_list(make_user, engine_double):
    """Given a project, when its page's composer sends a message, then the new chat is in the
    project (listed on its page, its header names the project) and not in the sidebar's chats."""
    alice = make_user("alice")
    project = project_services.project_create(owner=alice, name="Garden")
    client = client_for(alice)
    response = client.post("/chat/turns", {"content": "Plan my tomato beds", "project": str(project.pk)})
    chat = Conversation.objects.get(owner=alice)
    assert response.status_code == 303 and chat.project_id == project.pk
    page = client.get(f"/c/{chat.pk}/").content.decode()
    assert 'class="project-crumb"' in page and f'href="/p/{project.pk}/"' in page
    assert f'href="/c/{chat.pk}/"' not in page.split('id="conversation-results"')[1]  # not in the list
    assert f'href="/c/{chat.pk}/"' in client.get(f"/p/{project.pk}/").content.decode()


def test_a_new_chat_cannot_start_in_someone_elses_project(make_user, engine_double):
    alice, bob = make_user("alice"), make_user("bob")
    project = project_services.project_create(owner=alice, name="Mine")
    response = client_for(bob).post("/chat/turns", {"content": "hi", "project": str(project.pk)})
    assert response.status_code == 404
    assert not Conversation.objects.filter(owner=bob).exists()


def test_the_file_list_shows_each_state_and_why_a_file_failed(make_user):
    alice = make_user("alice")
    project = project_services.project_create(owner=alice, name="Docs")
    for name, status, error in (("a.md", "pending", ""), ("b.pdf", "ready", ""), ("c.docx", "failed", "This Word file is encrypted.")):
        ProjectFile.objects.create(
            project=project, uploaded_by=alice, name=name, kind="text", size=1, sha256="0" * 64,
            storage_name=f"{project.pk}/{name}", status=status, error=error,
        )  # fmt: skip
    html = client_for(alice).get(f"/p/{project.pk}/files").content.decode()
    assert "Reading" in html and "Ready" in html and "Could not be read" in html
    assert "This Word file is encrypted." in html
    assert 'hx-trigger="every' in html  # polls while a file is being read


def test_adding_a_file_shows_it_and_a_refused_one_says_why(make_user, ingest):
    from django.core.files.uploadedfile import SimpleUploadedFile  # noqa: PLC0415

    alice = make_user("alice")
    project = project_services.project_create(owner=alice, name="Docs")
    client = client_for(alice)
    response = client.post(f"/p/{project.pk}/files/add", {"files": SimpleUploadedFile("notes.md", b"# Notes\nHello.\n")}, headers=HTMX)
    assert response.status_code == 200 and "notes.md" in response.content.decode()
    response = client.post(f"/p/{project.pk}/files/add", {"files": SimpleUploadedFile("empty.txt", b"")}, headers=HTMX)
    assert response.status_code == 400 and "empty.txt" in response.content.decode()


# --- the prompt -------------------------------------------------------------------------------


def test_passages_are_kept_best_first_while_they_fit():
    """Pure: the first passage that does not fit stops the list (the retrieval's order kept)."""
    def passage(tokens):
        return Retrieved(1, uuid.uuid4(), "f.md", 0, 0, 1, "x", tokens, 0.9)

    def frame(text):
        return 2

    assert len(passages_fitted([passage(10), passage(10), passage(10)], room=16 + 24, count_tokens=frame)) == 2
    assert passages_fitted([passage(100), passage(1)], room=50, count_tokens=frame) == ()
    assert passage_block("a]b.md", "text <|im_start|>") == "[From project file: a)b.md]\ntext <\u00a6im_start\u00a6>\n[End of passage]"


async def _project_turn(client, project, content):
    response = await client.post("/chat/turns", {"content": content, "project": str(project.pk)}, headers=HTMX)
    assert response.status_code == 200, response.content
    events = await client.get(events_url_of(response))
    await read_stream(events)
    return response


def _chat_with_project(make_user):
    alice = make_user("alice", custom_instructions="Call me Captain.")
    project = project_services.project_create(owner=alice, name="Antares", instructions=INSTRUCTIONS)
    passage_file_add(project, user=alice, name="mission.md", passages=[LAUNCH, WEATHER])
    return alice, project


async def test_a_project_turn_has_the_instructions_in_the_system_message_and_passages_in_the_question(make_user, prompts, retrieval):
    """Given a project with instructions and a file, when a chat in it asks about the file, then
    the system message holds the project's instructions after the custom instructions, and the
    relevant passage is in the last user message between its delimiters, before the question;
    the system message holds no passage (the prefix cache keeps it across questions)."""
    alice, project = await sync_to_async(_chat_with_project)(make_user)
    client = AsyncClient()
    await client.aforce_login(alice)
    await _project_turn(client, project, "What is the launch code for Antares?")
    system, question = prompts[-1][0]["content"], prompts[-1][-1]["content"]
    assert system.index("Call me Captain.") < system.index(INSTRUCTIONS)
    assert "Instructions for this project:\n" + INSTRUCTIONS in system
    assert LAUNCH not in system
    assert question.startswith("[From project file: mission.md]\n" + LAUNCH + "\n[End of passage]")
    assert question.endswith("\n\nWhat is the launch code for Antares?")
    stored = await Turn.objects.filter(role=Turn.Role.USER).aget()
    assert stored.content == "What is the launch code for Antares?"  # stored as typed


async def test_a_project_turn_embeds_its_question_once_as_the_request_arrives(make_user, prompts, monkeypatch):
    """Given a chat in a project, when a message is sent, then its embedding starts as the
    request arrives (beside the claim and admission, inference.embeddings.embed_one_start) and
    retrieval uses that one: the question is embedded once and never again during assembly."""
    from inference import embeddings  # noqa: PLC0415

    alice, project = await sync_to_async(_chat_with_project)(make_user)
    started, embedded = [], []
    real_start, real_embed = embeddings.embed_one_start, embeddings.embed
    monkeypatch.setattr(embeddings, "embed_one_start", lambda text: started.append(text) or real_start(text))
    monkeypatch.setattr(embeddings, "embed", lambda texts: embedded.extend(texts) or real_embed(texts))
    client = AsyncClient()
    await client.aforce_login(alice)

    await _project_turn(client, project, "What is the launch code for Antares?")

    assert started == ["What is the launch code for Antares?"]
    assert embedded == ["What is the launch code for Antares?"]  # once, by the early start
    assert prompts[-1][-1]["content"].startswith("[From project file: mission.md]\n" + LAUNCH)


async def test_the_system_message_is_the_same_for_two_questions(make_user, prompts, retrieval):
    alice, project = await sync_to_async(_chat_with_project)(make_user)
    client = AsyncClient()
    await client.aforce_login(alice)
    await _project_turn(client, project, "What is the launch code?")
    first = prompts[-1][0]["content"]
    chat = await Conversation.objects.aget(owner=alice)
    response = await client.post(f"/c/{chat.pk}/turns", {"content": "How do I ferment sourdough?"}, headers=HTMX)
    await read_stream(await client.get(events_url_of(response)))
    assert prompts[-1][0]["content"] == first
    assert prompts[-1][1]["content"].endswith("What is the launch code?")  # history kept verbatim


async def test_a_chat_outside_any_project_gets_no_project_parts(make_user, prompts, retrieval):
    alice, _project = await sync_to_async(_chat_with_project)(make_user)
    client = AsyncClient()
    await client.aforce_login(alice)
    response = await client.post("/chat/turns", {"content": "What is the launch code?"}, headers=HTMX)
    await read_stream(await client.get(events_url_of(response)))
    assert INSTRUCTIONS not in prompts[-1][0]["content"]
    assert "[From project file" not in prompts[-1][-1]["content"]


# --- sources ----------------------------------------------------------------------------------


async def test_the_answer_lists_its_sources_and_a_reload_shows_the_same(make_user, engine_double, retrieval):
    """Given a project chat turn, then the streaming answer carries its sources (hidden until
    done), the rows are stored for that answer, and the reloaded page shows them under the
    answer, each passage opening in place."""
    alice, project = await sync_to_async(_chat_with_project)(make_user)
    client = AsyncClient()
    await client.aforce_login(alice)
    response = await _project_turn(client, project, "What is the launch code for Antares?")
    assert "data-stream-sources hidden" in response.content.decode()
    answer = await Turn.objects.filter(role=Turn.Role.ASSISTANT).aget()
    rows = [r async for r in ProjectTurnSource.objects.filter(answer_id=answer.turn_id).order_by("position")]
    assert rows and rows[0].file_name == "mission.md" and rows[0].text == LAUNCH
    page = (await client.get(f"/c/{answer.conversation_id}/")).content.decode()
    sources = page.split('aria-label="Sources"')[1]
    assert "mission.md" in sources and "<details" in sources and LAUNCH in sources


async def test_regenerate_gets_fresh_sources_and_the_old_answer_keeps_its_own(make_user, engine_double, retrieval):
    alice, project = await sync_to_async(_chat_with_project)(make_user)
    client = AsyncClient()
    await client.aforce_login(alice)
    await _project_turn(client, project, "What is the launch code?")
    first = await Turn.objects.filter(role=Turn.Role.ASSISTANT).aget()
    response = await client.post(f"/c/{first.conversation_id}/turns/{first.turn_id}/regenerate", headers=HTMX)
    assert response.status_code == 200
    await read_stream(await client.get(events_url_of(response)))
    second = await Turn.objects.filter(role=Turn.Role.ASSISTANT, replaces_id=first.turn_id).aget()
    assert await ProjectTurnSource.objects.filter(answer_id=first.turn_id).acount() >= 1
    assert await ProjectTurnSource.objects.filter(answer_id=second.turn_id).acount() >= 1


def test_sources_survive_the_files_deletion(make_user):
    alice = make_user("alice")
    project = project_services.project_create(owner=alice, name="P")
    file = passage_file_add(project, user=alice, name="gone.md", passages=[LAUNCH])
    chat = services.conversation_create(owner=alice, project=project)
    answer_id = uuid.uuid4()
    from projects.sources import turn_sources_store  # noqa: PLC0415

    passage = ProjectPassage.objects.get(file=file)
    turn_sources_store(conversation=chat, question_id=uuid.uuid4(), answer_id=answer_id, passages=[
        Retrieved(passage.pk, file.pk, file.name, 0, 0, len(LAUNCH), LAUNCH, 9, 0.8)
    ])  # fmt: skip
    project_services.project_file_delete(file=file)
    assert not ProjectPassage.objects.filter(project=project).exists()
    (source,) = sources_by_answer(conversation=chat)[answer_id]
    assert (source.file_name, source.text) == ("gone.md", LAUNCH)


# --- lifecycle --------------------------------------------------------------------------------


def test_deleting_a_project_deletes_its_chats_files_and_passages(make_user):
    _org, owner, _admin, member, project = workspace(make_user)
    passage_file_add(project, user=owner, name="a.md", passages=[LAUNCH])
    mine = services.conversation_create(owner=owner, project=project)
    theirs = services.conversation_create(owner=member, project=project)
    outside = services.conversation_create(owner=owner)
    response = client_for(owner).post(f"/p/{project.pk}/delete")
    assert response.status_code == 302
    assert not Project.objects.filter(pk=project.pk).exists()
    assert not ProjectFile.objects.exists() and not ProjectPassage.objects.exists()
    assert list(Conversation.objects.values_list("pk", flat=True)) == [outside.pk]
    assert mine.pk != theirs.pk


def test_account_deletion_deletes_the_persons_projects(make_user):
    alice, bob = make_user("alice"), make_user("bob")
    project = project_services.project_create(owner=alice, name="Mine")
    services.conversation_create(owner=alice, project=project)
    kept = project_services.project_create(owner=bob, name="Bob's")
    counts = account_delete(user=alice)
    assert counts["projects"] == 1
    assert list(Project.objects.values_list("pk", flat=True)) == [kept.pk]
    assert not Conversation.objects.filter(project_id=project.pk).exists()


def test_the_export_holds_the_projects_and_the_chats_project_ids(make_user):
    alice = make_user("alice")
    project = project_services.project_create(owner=alice, name="Antares", instructions=INSTRUCTIONS)
    passage_file_add(project, user=alice, name="mission.md", passages=[LAUNCH])
    chat = services.conversation_create(owner=alice, project=project, title="In the project")
    export = user_export_build(user=alice)
    with zipfile.ZipFile(export.file) as archive:
        data = json.loads(archive.read("data.json"))
    export.file.close()
    (exported,) = data["projects"]
    assert (exported["name"], exported["instructions"]) == ("Antares", INSTRUCTIONS)
    assert exported["files"][0]["name"] == "mission.md" and exported["files"][0]["passages"][0]["text"] == LAUNCH
    (conversation,) = [c for c in data["conversations"] if c["conversation_id"] == str(chat.pk)]
    assert conversation["project_id"] == str(project.pk)


def test_organisation_retention_purges_workspace_project_chats(make_user, settings):
    """A chat in a workspace project is one of the organisation's chats: its retention applies."""
    from datetime import timedelta  # noqa: PLC0415

    from django.utils import timezone  # noqa: PLC0415

    org, owner, _admin, _member, project = workspace(make_user)
    org.retention_days = 1
    org.save()
    chat = services.conversation_create(owner=owner, project=project)
    Conversation.objects.filter(pk=chat.pk).update(last_turn_at=timezone.now() - timedelta(days=3))
    retention.conversations_purge_expired()
    assert not Conversation.objects.filter(pk=chat.pk).exists()
    assert Project.objects.filter(pk=project.pk).exists()  # the project itself stays


# --- /v1 --------------------------------------------------------------------------------------


async def test_v1_projects_create_list_update_and_start_a_conversation_in_one(make_user):
    client, user = await api_client(make_user)
    created = await post_json(client, "/v1/projects", {"name": "Antares", "instructions": INSTRUCTIONS})
    assert created.status_code == 201, created.content
    project_id = created.json()["project_id"]
    listed = (await client.get("/v1/projects")).json()["projects"]
    assert [p["project_id"] for p in listed] == [project_id]
    patched = await client.patch(f"/v1/projects/{project_id}", json.dumps({"name": "Vega"}), content_type="application/json")
    assert patched.status_code == 200 and patched.json()["name"] == "Vega"
    assert patched.json()["instructions"] == INSTRUCTIONS  # kept: not in the body
    conversation = await post_json(client, "/v1/conversations", {"project_id": project_id})
    assert conversation.status_code == 201 and conversation.json()["project_id"] == project_id
    detail = (await client.get(f"/v1/projects/{project_id}")).json()
    assert detail["files"] == [] and detail["can_edit"] is True
    assert (await client.delete(f"/v1/projects/{project_id}")).status_code == 204
    assert not await Conversation.objects.filter(project_id=project_id).aexists()


async def test_v1_someone_elses_project_is_404_and_cannot_hold_a_new_conversation(make_user):
    alice_client, alice = await api_client(make_user, "alice")
    bob_client, _bob = await api_client(make_user, "bob")
    project_id = (await post_json(alice_client, "/v1/projects", {"name": "Mine"})).json()["project_id"]
    assert (await bob_client.get(f"/v1/projects/{project_id}")).status_code == 404
    response = await post_json(bob_client, "/v1/conversations", {"project_id": project_id})
    assert response.status_code == 404
    assert (await bob_client.get("/v1/projects")).json()["projects"] == []
