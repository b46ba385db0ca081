"""Attachments on the chat page in a real browser (headless Debian Chromium, Playwright) against
daphne serving the app in this process, with the scripted engine double: the composer's file
input goes with the message (multipart through htmx), the chip appears on the sent message with
a working download link, and a file that is not text is refused above the message box."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from attachments.models import Attachment
from tests.browser.chat_ui_support import COMPOSER_BOX, browser, new_page, send, ui_login  # noqa: F401 - fixtures
from tests.test_attachments import PNG, media  # noqa: F401 - fixture

pytestmark = pytest.mark.browser

FILE_INPUT = "#composer input[type=file]"


@pytest.fixture(autouse=True)
def _patient_moderation(settings):
    """A slow input check on a busy machine must not refuse the turn (not what is tested)."""
    settings.CHAT_MODERATION_TIMEOUT_S = 10


def test_a_file_sent_with_a_message_shows_as_a_chip_and_downloads(live, engine_double, make_user, new_page, tmp_path):
    """Given the chat page, when the user picks a Markdown file and sends a message, then the
    message shows the file's chip, the engine's prompt had the file, the picker is empty again,
    and the chip's link downloads the file as it was."""
    notes = tmp_path / "notes.md"
    notes.write_text("# Notes\n\nThe launch code is tangerine.\n")
    make_user("filer")
    page = new_page()
    ui_login(page, live.url, "filer")

    page.set_input_files(FILE_INPUT, str(notes))
    expect(page.locator("[data-attachment-picked] li")).to_contain_text("notes.md")
    send(page, "What is the launch code?")

    chip = page.locator("#messages article.user .attachment-chip")
    expect(chip).to_contain_text("notes.md")
    expect(page.locator("#messages article.assistant.complete")).to_have_count(1)
    assert len(engine_double.requests) == 1
    assert Attachment.objects.get().turn_id is not None
    assert page.eval_on_selector(FILE_INPUT, "input => input.files.length") == 0
    with page.expect_download() as download:
        chip.locator("a").click()
    assert download.value.suggested_filename == "notes.md"
    assert open(download.value.path(), "rb").read() == notes.read_bytes()


def test_a_png_named_txt_is_refused_above_the_message_box(live, engine_double, make_user, new_page, tmp_path):
    photo = tmp_path / "photo.txt"
    photo.write_bytes(PNG)
    make_user("picky")
    page = new_page()
    ui_login(page, live.url, "picky")

    page.set_input_files(FILE_INPUT, str(photo))
    send(page, "Look at this")

    expect(page.locator("#composer-error")).to_contain_text("image/png")
    expect(page.locator("#messages article.user")).to_have_count(0)
    assert engine_double.requests == []
    assert not Attachment.objects.exists()


def test_a_file_over_the_limit_is_refused_before_it_is_sent(live, engine_double, make_user, new_page, tmp_path, settings):
    settings.CHAT_ATTACHMENT_MAX_BYTES = 100
    big = tmp_path / "big.txt"
    big.write_text("word " * 100)
    make_user("big")
    page = new_page()
    ui_login(page, live.url, "big")
    posts: list[str] = []
    page.on("request", lambda r: posts.append(r.url) if r.method == "POST" else None)

    page.set_input_files(FILE_INPUT, str(big))
    expect(page.locator("#composer-error")).to_contain_text("at most 100 bytes")
    send(page, "Read this")
    page.wait_for_timeout(500)

    assert posts == []
