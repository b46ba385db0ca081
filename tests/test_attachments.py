"""Attachments (issue 8): uploads judged by content (edge cases), the permission-checked
download, and files deleted with their conversation. Scripted engine double (its tokenizer
counts one token per word); files in a temporary storage folder."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import transaction
from django.test import Client
from django.utils import timezone

from accounts.models import Membership, Organisation
from attachments.models import Attachment
from attachments.services import attachment_storage
from conversations import deletion, retention, services
from conversations.models import Conversation
from tests.api_support import api_client, assert_error, new_conversation

pytestmark = pytest.mark.django_db(transaction=True)

PNG = (
    b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00\x00\x1f"
    b"\x15\xc4\x89\x00\x00\x00\rIDATx\x9cc\xf8\x0f\x00\x00\x01\x01\x00\x05\x18\xd8N\x00\x00\x00\x00IEND"
    b"\xaeB`\x82"
)


def pdf_bytes(*pages: str) -> bytes:
    """A minimal valid PDF whose pages show ``pages`` (Helvetica, one line each; "" for a blank
    page with no text at all)."""
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>"]
    kids = " ".join(f"{4 + 2 * i} 0 R" for i in range(len(pages)))
    objects.append(f"<< /Type /Pages /Kids [{kids}] /Count {len(pages)} >>".encode())
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    for i, text in enumerate(pages):
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R "
            f">> >> /Contents {5 + 2 * i} 0 R >>".encode()
        )
        escaped = text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
        body = f"BT /F1 12 Tf 72 720 Td ({escaped}) Tj ET".encode("latin-1") if text else b""
        objects.append(b"<< /Length %d >>\nstream\n" % len(body) + body + b"\nendstream")
    out = b"%PDF-1.4\n"
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n".encode() + body + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{offset:010d} 00000 n \n".encode() for offset in offsets)
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return out


def encrypted_pdf(text: str) -> bytes:
    import io

    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(pdf_bytes(text))))
    writer.encrypt(user_password="secret", algorithm="RC4-128")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


@pytest.fixture(autouse=True)
def media(settings, tmp_path):
    """Attachment files in a folder of this test's own."""
    settings.CHAT_ATTACHMENT_STORAGE = {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": str(tmp_path / "attachments")},
    }
    return tmp_path / "attachments"


def stored_files(media) -> list:
    return [p for p in media.rglob("*") if p.is_file()] if media.exists() else []


async def upload(client, conversation_id: str, name: str, data: bytes, content_type: str = "application/octet-stream"):
    return await client.post(
        f"/v1/conversations/{conversation_id}/attachments",
        {"file": SimpleUploadedFile(name, data, content_type=content_type)},
    )


async def api_conversation(make_user, username="uploader"):
    client, user = await api_client(make_user, username=username)
    return client, user, await new_conversation(client)


# --- uploads: what is accepted ----------------------------------------------------------------


async def test_a_text_file_is_stored_with_its_token_count(make_user, engine_double, media):
    """Given a Markdown file, when uploaded, then 201 with the /v1 shape, and the bytes as sent
    are in storage under the conversation, not yet sent with a message."""
    client, _, conversation_id = await api_conversation(make_user)
    data = "# Notes\n\nThe launch code is tangerine.\n".encode()
    response = await upload(client, conversation_id, "notes.md", data, "text/markdown")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["name"] == "notes.md"
    assert body["content_type"] == "text/plain"
    assert (body["tokens"], body["total_tokens"], body["truncated"]) == (7, 7, False)
    attachment = await Attachment.objects.aget(pk=body["attachment_id"])
    assert attachment.turn_id is None
    assert attachment_storage().open(attachment.storage_name).read() == data


async def test_a_pdf_named_txt_is_treated_as_a_pdf(make_user, engine_double):
    """Type by content, not by name: PDF magic bytes make it a PDF, whatever it is called."""
    client, _, conversation_id = await api_conversation(make_user)
    response = await upload(client, conversation_id, "notes.txt", pdf_bytes("Quarterly revenue rose."), "text/plain")
    assert response.status_code == 201, response.content
    assert response.json()["content_type"] == "application/pdf"
    attachment = await Attachment.objects.aget(pk=response.json()["attachment_id"])
    assert "Quarterly revenue rose." in attachment.text
    assert attachment.pages == 1


async def test_a_pdf_with_an_empty_user_password_opens(make_user, engine_double):
    import io

    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(pdf_bytes("Only printing is restricted."))))
    writer.encrypt(user_password="", owner_password="owner", algorithm="RC4-128")
    out = io.BytesIO()
    writer.write(out)
    client, _, conversation_id = await api_conversation(make_user)
    response = await upload(client, conversation_id, "locked-lightly.pdf", out.getvalue())
    assert response.status_code == 201, response.content


async def test_a_long_text_is_cut_to_the_token_limit_with_both_counts(make_user, engine_double, settings):
    settings.CHAT_ATTACHMENT_MAX_TOKENS = 5
    client, _, conversation_id = await api_conversation(make_user)
    words = " ".join(f"w{i}" for i in range(20))
    response = await upload(client, conversation_id, "long.txt", words.encode())
    body = response.json()
    assert (body["tokens"], body["total_tokens"], body["truncated"]) == (5, 20, True)
    attachment = await Attachment.objects.aget(pk=body["attachment_id"])
    assert attachment.text == "w0 w1 w2 w3 w4"


# --- uploads: what is refused, and nothing stored -----------------------------------------------


async def refused(make_user, media, name: str, data: bytes, status: int, code: str):
    client, _, conversation_id = await api_conversation(make_user)
    response = await upload(client, conversation_id, name, data)
    assert_error(response, status, code)
    assert not await Attachment.objects.filter(conversation_id=conversation_id).aexists()
    assert stored_files(media) == []
    return response.json()["error"]["message"]


async def test_an_empty_file_is_refused(make_user, engine_double, media):
    message = await refused(make_user, media, "empty.txt", b"", 400, "empty_file")
    assert "empty.txt is empty" in message


async def test_a_whitespace_only_file_is_refused(make_user, engine_double, media):
    await refused(make_user, media, "blank.md", b" \n\t\n", 400, "empty_file")


async def test_an_oversize_file_is_refused_naming_the_limit(make_user, engine_double, media, settings):
    settings.CHAT_ATTACHMENT_MAX_BYTES = 1024
    message = await refused(make_user, media, "big.txt", b"a " * 600, 413, "file_too_large")
    assert "1.0 KB" in message  # the limit, so the person knows what fits


async def test_a_png_named_txt_is_refused_as_what_it_is(make_user, engine_double, media):
    """A .txt that is really a PNG is refused (415), and the message says it is an image."""
    message = await refused(make_user, media, "photo.txt", PNG, 415, "unsupported_file_type")
    assert "image/png" in message


async def test_non_utf8_text_is_refused_with_where_and_what_to_do(make_user, engine_double, media):
    latin1 = "Caf\u00e9 cr\u00e8me\n".encode("latin-1")
    message = await refused(make_user, media, "menu.txt", latin1, 415, "unsupported_encoding")
    assert "0xE9 on line 1" in message
    assert "UTF-8" in message


async def test_utf16_text_is_refused(make_user, engine_double, media):
    await refused(make_user, media, "wide.txt", "hello".encode("utf-16"), 415, "unsupported_encoding")


async def test_text_with_nul_bytes_is_refused(make_user, engine_double, media):
    message = await refused(make_user, media, "dump.log", b"header\nab\x00cd\n", 415, "unsupported_file_type")
    assert "U+0000 on line 2" in message


async def test_a_corrupt_pdf_is_refused(make_user, engine_double, media):
    truncated = pdf_bytes("Hello there")[:60]
    message = await refused(make_user, media, "report.pdf", truncated, 400, "pdf_unreadable")
    assert "report.pdf" in message


async def test_a_pdf_with_no_extractable_text_is_refused(make_user, engine_double, media):
    message = await refused(make_user, media, "scan.pdf", pdf_bytes("", ""), 400, "pdf_no_text")
    assert "2 pages" in message


async def test_a_password_protected_pdf_is_refused(make_user, engine_double, media):
    await refused(make_user, media, "secret.pdf", encrypted_pdf("classified"), 400, "pdf_encrypted")


async def test_a_pdf_over_the_page_limit_is_refused(make_user, engine_double, media, settings):
    settings.CHAT_ATTACHMENT_MAX_PDF_PAGES = 1
    await refused(make_user, media, "book.pdf", pdf_bytes("one", "two"), 413, "too_many_pages")


async def test_an_upload_that_is_not_multipart_is_refused(make_user, engine_double):
    client, _, conversation_id = await api_conversation(make_user)
    response = await client.post(
        f"/v1/conversations/{conversation_id}/attachments", b"hello", content_type="text/plain"
    )
    assert_error(response, 415, "unsupported_media_type")


async def test_an_upload_without_a_file_field_is_refused(make_user, engine_double):
    client, _, conversation_id = await api_conversation(make_user)
    response = await client.post(f"/v1/conversations/{conversation_id}/attachments", {"note": "no file"})
    assert_error(response, 400, "invalid_request")


async def test_uploading_into_someone_elses_conversation_is_not_found(make_user, engine_double, media):
    _, _, conversation_id = await api_conversation(make_user, "owner")
    intruder, _ = await api_client(make_user, username="intruder")
    response = await upload(intruder, conversation_id, "x.txt", b"hello")
    assert_error(response, 404, "not_found")
    assert stored_files(media) == []


async def test_a_zero_retention_organisation_cannot_attach_files(make_user, engine_double, media):
    """Nothing of a zero-retention organisation's conversations may be kept (issue 4): 403."""
    client, user = await api_client(make_user, username="zdr")

    def zdr_conversation():
        org = Organisation.objects.create(name="ZDR", slug="zdr", zero_retention=True)
        Membership.objects.create(organisation=org, user=user)
        return services.conversation_create(owner=user, org=org)

    conversation = await sync_to_async(zdr_conversation)()
    response = await upload(client, str(conversation.pk), "x.txt", b"hello")
    assert_error(response, 403, "attachments_not_allowed")
    assert stored_files(media) == []


async def test_a_conversation_holds_at_most_its_file_limit(make_user, engine_double, settings, media):
    settings.CHAT_ATTACHMENT_MAX_PER_CONVERSATION = 1
    client, _, conversation_id = await api_conversation(make_user)
    assert (await upload(client, conversation_id, "a.txt", b"one")).status_code == 201
    assert_error(await upload(client, conversation_id, "b.txt", b"two"), 409, "too_many_attachments")
    assert len(stored_files(media)) == 1


# --- names ------------------------------------------------------------------------------------


def test_a_file_name_is_cleaned_of_paths_and_control_characters():
    from attachments.files import clean_name

    assert clean_name("../../etc/passwd") == "passwd"
    assert clean_name("C:\\Users\\me\\report.pdf") == "report.pdf"
    assert clean_name("a\nb\u202e.txt") == "a b .txt"
    assert clean_name("") == "attachment"
    long = clean_name("x" * 300 + ".md")
    assert len(long) == 255 and long.endswith(".md")


# --- the download: who may have it ------------------------------------------------------------


def stored_attachment(owner, name="notes.txt", data=b"The launch code is tangerine.\n", org=None):
    """A conversation of ``owner`` with one file sent with its first message."""
    from attachments.files import file_read
    from attachments.services import attachments_create, attachments_link

    conversation = services.conversation_create(owner=owner, org=org)
    question = services.turn_append_user(conversation=conversation, content="read this")
    (attachment,) = attachments_create(
        conversation=conversation,
        uploads=[file_read(name=name, data=data, encode_text=lambda t: t.split())],
    )
    attachments_link(conversation=conversation, question=question, attachments=[attachment])
    return conversation, attachment


def download_url(attachment: Attachment) -> str:
    return f"/c/{attachment.conversation_id}/attachments/{attachment.attachment_id}"


def signed_in_client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_owner_downloads_the_file_as_an_attachment_never_as_a_page(make_user):
    _, attachment = stored_attachment(make_user("owner"))
    response = signed_in_client(attachment.conversation.owner).get(download_url(attachment))
    assert response.status_code == 200
    assert response.content == b"The launch code is tangerine.\n"
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert response["Content-Disposition"].startswith("attachment;")
    assert 'filename="notes.txt"' in response["Content-Disposition"]
    assert response["X-Content-Type-Options"] == "nosniff"


def test_a_non_ascii_name_is_offered_encoded_in_the_download(make_user):
    _, attachment = stored_attachment(make_user("owner"), name='r\u00e9sum\u00e9 "final".txt')
    response = signed_in_client(attachment.conversation.owner).get(download_url(attachment))
    assert "filename*=utf-8''r%C3%A9sum%C3%A9%20%22final%22.txt" in response["Content-Disposition"]


def test_an_html_file_is_sent_as_plain_text(make_user):
    """PF-X1: uploaded markup is never served as HTML, whatever its name."""
    page = b"<html><script>alert(document.cookie)</script></html>"
    _, attachment = stored_attachment(make_user("owner"), name="page.html", data=page)
    response = signed_in_client(attachment.conversation.owner).get(download_url(attachment))
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert response["Content-Disposition"].startswith("attachment;")
    assert "sandbox" in response["Content-Security-Policy"]


def test_a_pdf_is_sent_as_a_pdf(make_user):
    _, attachment = stored_attachment(make_user("owner"), name="r.pdf", data=pdf_bytes("Revenue"))
    response = signed_in_client(attachment.conversation.owner).get(download_url(attachment))
    assert response["Content-Type"] == "application/pdf"


def test_another_user_gets_not_found(make_user):
    _, attachment = stored_attachment(make_user("owner"))
    response = signed_in_client(make_user("someone-else")).get(download_url(attachment))
    assert response.status_code == 404


def test_an_anonymous_visitor_is_sent_to_sign_in(make_user):
    _, attachment = stored_attachment(make_user("owner"))
    response = Client().get(download_url(attachment))
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")


def test_a_member_of_another_organisation_gets_not_found(make_user):
    owner, outsider = make_user("owner"), make_user("outsider")
    ours = Organisation.objects.create(name="Ours", slug="ours")
    theirs = Organisation.objects.create(name="Theirs", slug="theirs")
    Membership.objects.create(organisation=ours, user=owner)
    Membership.objects.create(organisation=theirs, user=outsider, role=Membership.Role.OWNER)
    _, attachment = stored_attachment(owner, org=ours)
    response = signed_in_client(outsider).get(download_url(attachment))
    assert response.status_code == 404


def org_with(owner, reader) -> Organisation:
    org = Organisation.objects.create(name="Ours", slug="ours")
    Membership.objects.create(organisation=org, user=owner, role=Membership.Role.OWNER)
    Membership.objects.create(organisation=org, user=reader)
    return org


def test_a_workspace_member_downloads_a_file_of_a_conversation_shared_with_it(make_user):
    """Whoever may read the conversation may have its files (workspaces/: shared_with_org)."""
    owner, reader = make_user("owner"), make_user("reader")
    conversation, attachment = stored_attachment(owner, org=org_with(owner, reader))
    Conversation.objects.filter(pk=conversation.pk).update(shared_with_org=True)
    assert signed_in_client(reader).get(download_url(attachment)).status_code == 200


def test_a_workspace_member_gets_not_found_while_the_conversation_is_not_shared(make_user):
    owner, reader = make_user("owner"), make_user("reader")
    _, attachment = stored_attachment(owner, org=org_with(owner, reader))
    assert signed_in_client(reader).get(download_url(attachment)).status_code == 404


def test_a_file_is_not_found_under_another_conversation_of_the_same_owner(make_user):
    owner = make_user("owner")
    _, attachment = stored_attachment(owner)
    other = services.conversation_create(owner=owner)
    response = signed_in_client(owner).get(f"/c/{other.pk}/attachments/{attachment.attachment_id}")
    assert response.status_code == 404


# --- deleted with the conversation ------------------------------------------------------------


def test_deleting_the_conversation_deletes_its_files(make_user, media):
    conversation, attachment = stored_attachment(make_user("owner"))
    assert attachment_storage().exists(attachment.storage_name)
    response = signed_in_client(conversation.owner).post(f"/c/{conversation.pk}/delete")
    assert response.status_code == 302
    assert not attachment_storage().exists(attachment.storage_name)
    assert not Attachment.objects.filter(pk=attachment.pk).exists()
    assert stored_files(media) == []


async def test_deleting_through_the_api_deletes_its_files(make_user, engine_double, media):
    client, _, conversation_id = await api_conversation(make_user)
    assert (await upload(client, conversation_id, "a.txt", b"hello")).status_code == 201
    response = await client.delete(f"/v1/conversations/{conversation_id}")
    assert response.status_code == 204
    assert stored_files(media) == []


def test_a_deletion_that_rolls_back_keeps_the_file(make_user):
    """Files go only once the deletion is committed (transaction.on_commit)."""
    conversation, attachment = stored_attachment(make_user("owner"))
    conversation_id = conversation.pk
    with pytest.raises(RuntimeError), transaction.atomic():
        deletion.conversation_delete(conversation=conversation)
        raise RuntimeError("rolled back")
    assert Conversation.objects.filter(pk=conversation_id).exists()
    assert attachment_storage().exists(attachment.storage_name)


def test_the_retention_purge_deletes_expired_conversations_files(make_user, media):
    expired, old_file = stored_attachment(make_user("old", tier="free"))
    kept, new_file = stored_attachment(make_user("new", tier="free"))
    now = timezone.now()
    Conversation.objects.filter(pk=expired.pk).update(last_turn_at=now - timedelta(days=31))
    assert retention.conversations_purge_expired(now=now) == 1
    assert not attachment_storage().exists(old_file.storage_name)
    assert attachment_storage().exists(new_file.storage_name)
    assert not Attachment.objects.filter(pk=old_file.pk).exists()


def test_the_admin_deletes_the_file_with_the_row(make_user, django_user_model, media):
    conversation, attachment = stored_attachment(make_user("owner"))
    staff = django_user_model.objects.create_superuser("boss", password="x-long-password-1")
    client = signed_in_client(staff)
    assert client.get("/admin/attachments/attachment/").status_code == 200
    change = client.get(f"/admin/attachments/attachment/{attachment.pk}/change/")
    assert change.status_code == 200
    assert b"tangerine" not in change.content  # metadata only, never the user's text
    response = client.post(
        f"/admin/attachments/attachment/{attachment.pk}/delete/", {"post": "yes"}
    )
    assert response.status_code == 302
    assert not Attachment.objects.filter(pk=attachment.pk).exists()
    assert stored_files(media) == []


def test_a_missing_stored_file_is_a_clear_404_not_a_500(make_user):
    conversation, attachment = stored_attachment(make_user("owner"))
    attachment_storage().delete(attachment.storage_name)
    response = signed_in_client(conversation.owner).get(download_url(attachment))
    assert response.status_code == 404


def test_unknown_ids_are_not_found(make_user):
    owner = make_user("owner")
    conversation = services.conversation_create(owner=owner)
    response = signed_in_client(owner).get(f"/c/{conversation.pk}/attachments/{uuid.uuid4()}")
    assert response.status_code == 404
