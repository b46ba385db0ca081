"""Reading a project file: its kind by content, and its text within limits (issue 30).

No storage and no database here. Two steps, for the two places they run:

- :func:`kind_detect` on the request (cheap: the first bytes, a ZIP's central directory): PDF by
  its magic bytes, DOCX by being a ZIP with ``word/document.xml``, Markdown by a ``.md`` /
  ``.markdown`` name *and* text content, plain text otherwise, judged on the first
  :data:`HEAD_BYTES` bytes (attachments/files.py ``text_decode``). Anything else is refused
  (415) before a byte is stored.
- :func:`text_extract` in the Celery worker (never on a request's event loop): the whole text.
  PDF through attachments/files.py ``pdf_text`` (pypdf) with ``CHAT_PROJECT_FILE_MAX_PAGES``;
  DOCX with the standard library only: ``zipfile`` and a streaming ``expat`` parser that refuses
  any DTD (so no entity expansion, "billion laughs", or external entities: what ``defusedxml``
  forbids, without the dependency). The XML is inflated in :data:`INFLATE_CHUNK` pieces and
  fed to the parser as it comes, and reading stops at ``CHAT_PROJECT_DOCX_MAX_INFLATED_BYTES``
  whatever the ZIP *declares*: a zip bomb (Open WebUI PR #23705: a DOCX whose XML inflates to
  1 GB) costs at most that many bytes of inflation and one chunk of memory, and gets a clear 413.
  The declared sizes and ratio are checked first so most bombs are refused without inflating.
  Every kind stops past ``CHAT_PROJECT_FILE_MAX_CHARS`` characters and at the ``deadline``
  (``time.monotonic()`` seconds, checked between pages and between chunks).

Errors are :class:`FileRefused` (an ``AttachmentRejected``, so a ``gate.Refused``: /v1 renders
its status, code and message); the message says what is wrong and what to do.
"""

from __future__ import annotations

import codecs
import io
import re
import time
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from xml.parsers import expat

from django.conf import settings

from attachments.files import AttachmentRejected, is_pdf, pdf_text, size_text, text_decode

KINDS = ("text", "markdown", "pdf", "docx")  # ProjectFile.Kind values
ACCEPTED = "plain text (UTF-8), Markdown, a PDF or a Word document (.docx)"
MARKDOWN_SUFFIXES = (".md", ".markdown")
# How much of a text file the request looks at (the worker decodes the rest).
HEAD_BYTES = 64 * 1024
# Inflate this much of a DOCX part at a time: memory per chunk, and how often limits are checked.
INFLATE_CHUNK = 64 * 1024
DOCX_BODY = "word/document.xml"
ZIP_MAGIC = b"PK\x03\x04"
# Most entries a .docx may have: Word writes ~10-40; a ZIP with 100,000 tiny entries is another
# way to make a reader spend time on a small file.
DOCX_MAX_ENTRIES = 2_000
_W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
# What zipfile raises on a damaged or hostile archive, besides BadZipFile: a version or method it
# does not support (NotImplementedError), an encrypted entry (RuntimeError), offsets outside the
# file (ValueError: "negative seek value"), a corrupt deflate stream (zlib.error), a short read.
_ZIP_ERRORS = (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError, RuntimeError, zlib.error)


class FileRefused(AttachmentRejected):
    """A project file that cannot be read: ``status`` (400 / 413 / 415), ``code`` and
    ``message`` (for a person). Refusals of attachments/files.py's shared readers (an
    ``AttachmentRejected``) are the same kind of error for a project file."""


@dataclass(frozen=True)
class Extracted:
    """A file's text (``\\n`` line ends) and its page count (PDF, and DOCX when it says; None
    for text)."""

    text: str
    pages: int | None = None


# --- on the request -------------------------------------------------------------------------


def kind_detect(*, name: str, stream) -> str:
    """The kind of an upload (``text``, ``markdown``, ``pdf`` or ``docx``), by content.
    ``name``: the cleaned name (only tells Markdown from text); ``stream``: a seekable binary
    file (a Django ``UploadedFile``), left at position 0. Reads at most :data:`HEAD_BYTES` and,
    for a ZIP, its central directory. Raises FileRefused 415 (another kind of file, judged by
    content), 400 (no text in the first bytes)."""
    stream.seek(0)
    head = stream.read(HEAD_BYTES)
    stream.seek(0)
    if is_pdf(head):
        return "pdf"
    if head.startswith(ZIP_MAGIC):
        if DOCX_BODY in (_zip_names(stream) or ()):
            return "docx"
        raise FileRefused(
            415, "unsupported_file_type",
            f"{name} is a ZIP archive but not a Word document (it has no {DOCX_BODY}). Add "
            f"{ACCEPTED}; unpack an archive and add its files one by one.",
        )  # fmt: skip
    text_decode(name, _whole_characters(head))  # raises for binary data and other encodings
    return "markdown" if name.lower().endswith(MARKDOWN_SUFFIXES) else "text"


def _zip_names(stream) -> set[str] | None:
    try:
        with zipfile.ZipFile(stream) as archive:
            return set(archive.namelist()[:DOCX_MAX_ENTRIES + 1])
    except _ZIP_ERRORS:
        return None
    finally:
        stream.seek(0)


def _whole_characters(head: bytes) -> bytes:
    """``head`` without a UTF-8 sequence cut at its end (the head is a prefix of the file)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        decoder.decode(head, final=False)
    except UnicodeDecodeError:
        return head  # invalid before the end: text_decode says where
    pending = decoder.getstate()[0]  # the bytes of a sequence the cut left incomplete
    return head[: len(head) - len(pending)] if pending else head


# --- in the worker --------------------------------------------------------------------------


def text_extract(*, name: str, kind: str, data: bytes, deadline: float) -> Extracted:
    """The text of a file of ``kind`` (from :func:`kind_detect`), by the rules of the module
    docstring. ``deadline``: ``time.monotonic()`` value after which reading stops. Raises
    FileRefused / AttachmentRejected: 400 (unreadable, empty, encrypted or image-only PDF),
    413 (pages, characters, a zip bomb, ``took_too_long``: the deadline), 415 (content
    that is not what it was taken for)."""
    check = _limits(name, deadline)
    if kind == "pdf":
        text, pages = pdf_text(
            name, data, max_pages=settings.CHAT_PROJECT_FILE_MAX_PAGES, before_page=lambda _i: check(0)
        )
        check(len(text))
        return Extracted(text, pages)
    if kind == "docx":
        return _docx_text(name, data, check)
    text = text_decode(name, data)
    check(len(text))
    return Extracted(text)


def _limits(name: str, deadline: float) -> Callable[[int], None]:
    """A check of the time left and of ``chars`` extracted so far; raises FileRefused."""
    max_chars = settings.CHAT_PROJECT_FILE_MAX_CHARS
    seconds = settings.CHAT_PROJECT_FILE_MAX_SECONDS

    def check(chars: int) -> None:
        if chars > max_chars:
            raise FileRefused(
                413, "too_much_text",
                f"{name} has more than {max_chars:,} characters of text; a project file can have "
                "at most that many. Split it into smaller files and add them one by one.",
            )  # fmt: skip
        if time.monotonic() > deadline:
            raise FileRefused(
                413, "took_too_long",
                f"Reading {name} took longer than {seconds:g} s, so it was stopped. Split it "
                "into smaller files, or save it again (e.g. print to a new PDF) and add that.",
            )  # fmt: skip

    return check


def _docx_text(name: str, data: bytes, check: Callable[[int], None]) -> Extracted:
    """The text of a .docx (module docstring). Paragraphs are separated by a blank line; a
    paragraph in a "Heading N" style becomes a Markdown heading (``#`` * N), so passages can
    carry their section's heading as Markdown ones do."""
    unreadable = FileRefused(
        400, "docx_unreadable",
        f"{name} could not be read as a Word document: it looks damaged or incomplete. Open it, "
        "save it again as .docx, and add the new copy.",
    )  # fmt: skip
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except _ZIP_ERRORS:
        raise unreadable from None
    with archive:
        infos = archive.infolist()
        body = next((i for i in infos if i.filename == DOCX_BODY), None)
        if body is None:
            raise unreadable
        _check_declared(name, infos)
        pages = _docx_pages(name, archive, check)
        reader = _BodyReader(check)
        try:
            _inflate(name, archive, body, reader.feed, check)
            reader.close()
        except expat.ExpatError as exc:
            if reader.forbidden:
                raise FileRefused(
                    400, "docx_unsafe",
                    f"{name} declares a DTD or XML entities, which Word documents never do (they "
                    "are how XML bombs work), so it was not read. Save it again from a word "
                    "processor and add the new copy.",
                ) from None  # fmt: skip
            raise unreadable from exc
        except _ZIP_ERRORS:
            raise unreadable from None
    text = reader.text()
    check(len(text))
    if not text.strip():
        raise FileRefused(400, "empty_file", f"{name} has no text in it.")
    return Extracted(text, pages)


def _bomb(name: str, why: str) -> FileRefused:
    limit = settings.CHAT_PROJECT_DOCX_MAX_INFLATED_BYTES
    return FileRefused(
        413, "docx_too_large_inflated",
        f"{name} {why}; a Word document may unpack to at most {size_text(limit)}. It looks like a "
        "zip bomb rather than a document, so it was not read. If it is a real document, split it "
        "or save it without embedded files.",
    )  # fmt: skip


def _check_declared(name: str, infos: list[zipfile.ZipInfo]) -> None:
    """Refuse from the central directory alone: too many entries, a declared total past the
    cap, or an entry whose declared compression ratio is past ``CHAT_PROJECT_DOCX_MAX_RATIO``
    (the declared sizes may lie: :func:`_inflate` does not trust them)."""
    if len(infos) > DOCX_MAX_ENTRIES:
        raise _bomb(name, f"has {len(infos):,} entries (Word writes a few dozen)")
    declared = sum(i.file_size for i in infos)
    if declared > settings.CHAT_PROJECT_DOCX_MAX_INFLATED_BYTES:
        raise _bomb(name, f"declares {size_text(declared)} of content once unpacked")
    ratio_cap = settings.CHAT_PROJECT_DOCX_MAX_RATIO
    for info in infos:
        if info.file_size > 1024 * 1024 and info.file_size > ratio_cap * max(info.compress_size, 1):
            ratio = info.file_size / max(info.compress_size, 1)
            raise _bomb(name, f"has a part ({info.filename}) compressed {ratio:,.0f} to 1")


def _inflate(name: str, archive: zipfile.ZipFile, info: zipfile.ZipInfo, sink, check) -> int:
    """Inflate ``info`` into ``sink`` in :data:`INFLATE_CHUNK` pieces, stopping with a
    FileRefused 413 as soon as more than ``CHAT_PROJECT_DOCX_MAX_INFLATED_BYTES`` come out
    (whatever the entry declares) or the ratio to its compressed size passes
    ``CHAT_PROJECT_DOCX_MAX_RATIO`` past the first MiB. Returns the bytes inflated."""
    cap = settings.CHAT_PROJECT_DOCX_MAX_INFLATED_BYTES
    ratio_cap = settings.CHAT_PROJECT_DOCX_MAX_RATIO
    total = 0
    with archive.open(info) as part:
        while chunk := part.read(INFLATE_CHUNK):
            total += len(chunk)
            if total > cap:
                raise _bomb(name, f"unpacks to more than {size_text(cap)} ({info.filename})")
            if total > 1024 * 1024 and total > ratio_cap * max(info.compress_size, 1):
                raise _bomb(name, f"has a part ({info.filename}) compressed more than {ratio_cap} to 1")
            sink(chunk)
            check(0)
    return total


def _docx_pages(name: str, archive: zipfile.ZipFile, check) -> int | None:
    """The page count Word stored in ``docProps/app.xml`` (as of its last save), if any."""
    try:
        info = archive.getinfo("docProps/app.xml")
    except KeyError:
        return None
    chunks: list[bytes] = []
    try:
        _inflate(name, archive, info, chunks.append, check)
    except _ZIP_ERRORS:
        return None
    found = re.search(rb"<(?:\w+:)?Pages>\s*(\d{1,7})\s*</", b"".join(chunks)[: 1024 * 1024])
    return int(found.group(1)) if found else None


class _BodyReader:
    """A streaming reader of ``word/document.xml``: the text of ``w:t`` runs, tabs and breaks,
    one paragraph per ``w:p``. Holds only the text found (its length is checked by ``check``
    at each paragraph's end). A DTD or an entity declaration stops the parse (``forbidden``)."""

    def __init__(self, check: Callable[[int], None]):
        self.check = check
        self.paragraphs: list[str] = []
        self.chars = 0
        self.runs: list[str] = []
        self.heading = 0
        self.in_text = False
        self.forbidden = False
        parser = expat.ParserCreate(namespace_separator=" ")
        parser.StartDoctypeDeclHandler = self._forbid
        parser.EntityDeclHandler = self._forbid
        parser.UnparsedEntityDeclHandler = self._forbid
        parser.ExternalEntityRefHandler = self._forbid
        parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
        parser.StartElementHandler = self._start
        parser.EndElementHandler = self._end
        parser.CharacterDataHandler = self._characters
        parser.buffer_text = True
        self.parser = parser

    def _forbid(self, *_args):
        self.forbidden = True
        raise expat.ExpatError("DTDs and entity declarations are not allowed")

    def feed(self, chunk: bytes) -> None:
        self.parser.Parse(chunk, False)

    def close(self) -> None:
        self.parser.Parse(b"", True)

    def _start(self, tag: str, attrs: dict) -> None:
        namespace, _, local = tag.rpartition(" ")
        if namespace != _W:
            return
        if local == "t":
            self.in_text = True
        elif local == "tab":
            self.runs.append("\t")
        elif local in ("br", "cr"):
            self.runs.append("\n")
        elif local == "p":
            self.runs, self.heading = [], 0
        elif local == "pStyle":
            style = attrs.get(f"{_W} val", "")
            found = re.fullmatch(r"(?i)heading\s*([1-6])", style)
            if found:
                self.heading = int(found.group(1))

    def _end(self, tag: str) -> None:
        namespace, _, local = tag.rpartition(" ")
        if namespace != _W:
            return
        if local == "t":
            self.in_text = False
        elif local == "p":
            paragraph = "".join(self.runs).strip()
            self.runs = []
            if paragraph:
                if self.heading:
                    paragraph = "#" * self.heading + " " + " ".join(paragraph.split())
                self.paragraphs.append(paragraph)
                self.chars += len(paragraph) + 2
                self.check(self.chars)

    def _characters(self, data: str) -> None:
        if self.in_text:
            self.runs.append(data)

    def text(self) -> str:
        return "\n\n".join(self.paragraphs)
