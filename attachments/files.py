"""Reading an uploaded file: its type by content, its text, its length in tokens.

No storage and no database here: :func:`file_read` takes bytes and returns an :class:`Extracted`
or raises :class:`AttachmentRejected` with a message a person can act on. The rules (issue 8):

- **Type by content, never by name.** A PDF is recognised by its magic bytes (``filetype``) and
  read with ``pypdf``, whatever it is called: a PDF named ``notes.txt`` is treated as a PDF.
  Anything else must be text: UTF-8 (an optional BOM is dropped) with no NUL or other control
  bytes besides tab, newline, carriage return and form feed. A ``.txt`` that is really a PNG, a
  ZIP, UTF-16 or Latin-1 text is refused (415), and the message says what it was.
- **Limits.** Empty files and files with no text (400); over ``CHAT_ATTACHMENT_MAX_BYTES`` bytes
  or (PDF) ``CHAT_ATTACHMENT_MAX_PDF_PAGES`` pages (413); PDFs that cannot be parsed or are
  password-protected (400).
- **Tokens.** The text is counted with the serving model's tokenizer and cut to at most
  ``CHAT_ATTACHMENT_MAX_TOKENS`` tokens (:func:`text_truncate`); the whole length is kept so the
  cut can be shown ("first N of M tokens").
"""

from __future__ import annotations

import hashlib
import io
import logging
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass

import filetype
from django.conf import settings

from gateway.gate import Refused

logger = logging.getLogger(__name__)

EncodeText = Callable[[str], list[int]]

ACCEPTED = "plain text (UTF-8), Markdown, source code or a PDF"


class AttachmentRejected(Refused):
    """A file (or a reference to one) that cannot be attached: ``status`` 400 / 403 / 404 / 409
    / 413 / 415, ``code`` (the /v1 error type) and ``message`` (for a person: what is wrong and
    what to do). A ``gate.Refused``, so the chat page and ``/v1`` render it like any refusal
    before engine work; nothing is stored when it is raised."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(status, code, message)


@dataclass(frozen=True)
class Extracted:
    """A file that passed the checks. ``kind``: ``text`` or ``pdf`` (Attachment.Kind);
    ``data``: the bytes as uploaded; ``text``: the text for prompts, at most
    ``max_tokens`` tokens; ``tokens``: the whole text's length in tokens (estimated for very
    long texts: ``tokens_estimated``, see :func:`count_tokens`); ``prompt_tokens``: ``text``'s;
    ``pages``: a PDF's page count (None for text)."""

    name: str
    kind: str
    data: bytes
    sha256: str
    text: str
    tokens: int
    prompt_tokens: int
    pages: int | None = None
    tokens_estimated: bool = False

    @property
    def truncated(self) -> bool:
        return self.prompt_tokens < self.tokens


# --- names ------------------------------------------------------------------------------------

NAME_MAX = 255


def clean_name(raw: str | None) -> str:
    """A file name fit to show and to offer in a download: the last path component (``/`` or
    ``\\``), control and format characters removed (NFC), whitespace collapsed, at most 255
    characters with the extension kept; ``"attachment"`` when nothing is left. Display only: the
    type is never taken from it."""
    name = unicodedata.normalize("NFC", raw or "")
    name = re.split(r"[/\\]", name)[-1]
    name = "".join(" " if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") else c for c in name)
    name = " ".join(name.split()).strip(". ") or "attachment"
    if len(name) > NAME_MAX:
        stem, dot, extension = name.rpartition(".")
        if dot and 0 < len(extension) <= 16:
            name = stem[: NAME_MAX - len(extension) - 1] + "." + extension
        else:
            name = name[:NAME_MAX]
    return name


def size_text(size: int) -> str:
    """``size`` bytes for a message: "512 bytes", "12.5 KB", "3.2 MB" (binary units)."""
    if size < 1024:
        return f"{size} bytes"
    if size < 1024 * 1024:
        return f"{size / 1024:.1f} KB"
    return f"{size / (1024 * 1024):.1f} MB"


# --- the checks -------------------------------------------------------------------------------

# C0 controls except TAB, LF, FF, CR; and DEL. Text files do not contain these; binary data does.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0e-\x1f\x7f]")


def _refuse_binary(
    name: str, data: bytes, otherwise: str, code: str = "unsupported_file_type"
) -> AttachmentRejected:
    """415 for bytes that are not text, naming what they are when ``filetype`` knows (else
    ``code`` with the message ``otherwise``)."""
    kind = filetype.guess(data[:8192])
    if kind is not None:
        return AttachmentRejected(
            415, "unsupported_file_type",
            f"{name} is {kind.mime} data (judged by its content, not its name), which cannot be "
            f"attached. Attach {ACCEPTED}.",
        )  # fmt: skip
    return AttachmentRejected(415, code, otherwise)


def text_decode(name: str, data: bytes) -> str:
    """``data`` as UTF-8 text (a leading BOM dropped, line ends made ``\\n``). Raises
    AttachmentRejected 415 for UTF-16, bytes that are not UTF-8, NUL and other control bytes,
    and 400 for a file with no text in it (only whitespace)."""
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        raise AttachmentRejected(
            415, "unsupported_encoding",
            f"{name} is UTF-16 text; save it as UTF-8 and attach it again.",
        )  # fmt: skip
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise _refuse_binary(
            name, data,
            f"{name} is not UTF-8 text (byte 0x{data[exc.start]:02X} on line {line} is not valid "
            f"UTF-8). Save it as UTF-8 and attach it again; files can be {ACCEPTED}.",
            "unsupported_encoding",
        ) from None  # fmt: skip
    found = _CONTROL.search(text)
    if found is not None:
        line = text.count("\n", 0, found.start()) + 1
        raise _refuse_binary(
            name, data,
            f"{name} contains the control character U+{ord(found.group()):04X} on line {line}, "
            f"which text files do not have: it looks like binary data. Attach {ACCEPTED}.",
        )  # fmt: skip
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if not text.strip():
        raise AttachmentRejected(400, "empty_file", f"{name} has no text in it (only whitespace).")
    return text


def is_pdf(data: bytes) -> bool:
    """Whether ``data`` is a PDF by its magic bytes (``filetype``), whatever its name."""
    kind = filetype.guess(data[:8192])
    return kind is not None and kind.mime == "application/pdf"


def pdf_text(
    name: str, data: bytes, *, max_pages: int | None = None, before_page: Callable[[int], None] | None = None
) -> tuple[str, int]:
    """(text, pages) of a PDF, pages joined by blank lines, control characters turned into
    spaces. Raises AttachmentRejected: 400 for a PDF that cannot be parsed, one that is
    password-protected, or one with no extractable text (e.g. scanned images); 413 for more than
    ``max_pages`` pages (default ``settings.CHAT_ATTACHMENT_MAX_PDF_PAGES``).
    ``before_page(index)`` is called before each page's text is extracted (project files check
    their wall-time deadline there); an AttachmentRejected it raises goes through as it is."""
    from pypdf import PdfReader  # noqa: PLC0415 - only needed for PDFs

    try:
        reader = PdfReader(io.BytesIO(data), strict=False)
        if reader.is_encrypted and not _pdf_unlock(reader):
            raise AttachmentRejected(
                400, "pdf_encrypted",
                f"{name} is password-protected. Save a copy without the password and attach that.",
            )  # fmt: skip
        pages = len(reader.pages)
        limit = settings.CHAT_ATTACHMENT_MAX_PDF_PAGES if max_pages is None else max_pages
        if pages > limit:
            raise AttachmentRejected(
                413, "too_many_pages",
                f"{name} has {pages:,} pages; a PDF can have at most {limit:,}. Attach the pages "
                "you need (e.g. print them to a smaller PDF).",
            )  # fmt: skip
        texts = []
        for index, page in enumerate(reader.pages):
            if before_page is not None:
                before_page(index)
            texts.append(page.extract_text() or "")
    except AttachmentRejected:
        raise
    except Exception as exc:  # noqa: BLE001 - a parser on untrusted bytes: any failure is "corrupt"
        logger.info("PDF %r not readable: %s: %s", name, type(exc).__name__, exc)
        raise AttachmentRejected(
            400, "pdf_unreadable",
            f"{name} could not be read as a PDF: it looks damaged or incomplete. Open it, save "
            "or export it again as PDF, and attach the new copy.",
        ) from None  # fmt: skip
    text = "\n\n".join(_CONTROL.sub(" ", t).strip() for t in texts if t.strip())
    if not text.strip():
        raise AttachmentRejected(
            400, "pdf_no_text",
            f"{name} has no text that can be extracted ({pages:,} page{'s' if pages != 1 else ''}"
            ", probably scanned images). Attach a PDF with a text layer (e.g. after OCR), or "
            "paste the text into your message.",
        )  # fmt: skip
    return text, pages


def _pdf_unlock(reader) -> bool:
    """Whether an encrypted PDF opens with the empty user password (many "protected" PDFs
    only restrict printing or copying)."""
    try:
        return bool(reader.decrypt(""))
    except Exception:  # noqa: BLE001 - unsupported algorithm, missing crypto library: locked
        return False


# --- tokens -----------------------------------------------------------------------------------

# Texts up to this many characters are counted exactly; longer ones from a sample of this size.
# Measured here: the SmolLM2 tokenizer takes ~1 s per 700,000 characters, so an exact count of a
# 10 MB file would hold a request for ~14 s of CPU, for a number only shown in a notice.
EXACT_COUNT_CHARS = 262_144


def count_tokens(text: str, encode_text: EncodeText) -> tuple[int, bool]:
    """(tokens in ``text``, whether estimated). Exact up to ``EXACT_COUNT_CHARS`` characters;
    beyond, the tokens of the first ``EXACT_COUNT_CHARS`` characters scaled by length."""
    if len(text) <= EXACT_COUNT_CHARS:
        return len(encode_text(text)), False
    sample = text[:EXACT_COUNT_CHARS]
    return max(1, round(len(encode_text(sample)) * len(text) / len(sample))), True


def text_truncate(
    text: str, max_tokens: int, encode_text: EncodeText, *, total: int | None = None
) -> tuple[str, int]:
    """The longest start of ``text`` with at most ``max_tokens`` tokens (by ``encode_text``),
    cut at a line end or a space near the limit where there is one. Returns (that text, its
    tokens). ``total``: ``text``'s own token count, if known. O(log n) encodes of pieces about
    twice the size of the result, however long ``text`` is."""
    if max_tokens <= 0 or not text:
        return "", 0
    total = len(encode_text(text)) if total is None else total
    if total <= max_tokens:
        return text, total

    def fits(chars: int) -> bool:
        return len(encode_text(text[:chars])) <= max_tokens

    # Exponential search up from the average characters per token, then bisection: the piece
    # encoded stays about twice as long as the result.
    low, high = 0, len(text)  # fits(low); not fits(high) (total > max_tokens)
    probe = max(1, min(len(text) - 1, len(text) * max_tokens // total))
    while probe < high:
        if fits(probe):
            low, probe = probe, probe * 2
        else:
            high = probe
            break
    while high - low > 1:
        middle = (low + high) // 2
        if fits(middle):
            low = middle
        else:
            high = middle
    kept = text[:low]
    boundary = max(kept.rfind("\n", len(kept) * 4 // 5), kept.rfind(" ", len(kept) * 19 // 20))
    if boundary > 0:
        kept = kept[:boundary]
    kept = kept.rstrip()
    count = len(encode_text(kept))
    while count > max_tokens and kept:  # tokenizers are nearly, not strictly, monotone
        kept = kept[: len(kept) * 9 // 10].rstrip()
        count = len(encode_text(kept))
    return kept, count


# --- the whole read ---------------------------------------------------------------------------


def file_read(*, name: str, data: bytes, encode_text: EncodeText) -> Extracted:
    """Check and extract one uploaded file (module docstring). ``name``: as uploaded (cleaned
    here); ``data``: its bytes; ``encode_text``: the serving model's tokenizer (text -> ids).
    Raises AttachmentRejected (400 empty / no text / corrupt or locked PDF, 413 too large,
    415 not text or PDF)."""
    name = clean_name(name)
    limit = settings.CHAT_ATTACHMENT_MAX_BYTES
    if not data:
        raise AttachmentRejected(
            400, "empty_file", f"{name} is empty (0 bytes). Attach a file with text in it."
        )
    if len(data) > limit:
        raise AttachmentRejected(
            413, "file_too_large",
            f"{name} is {size_text(len(data))}; a file can be at most {size_text(limit)}. Attach a "
            "smaller file or only the part you need.",
        )  # fmt: skip
    if is_pdf(data):
        text, pages, kind = *pdf_text(name, data), "pdf"
    else:
        text, pages, kind = text_decode(name, data), None, "text"
    tokens, estimated = count_tokens(text, encode_text)
    kept, kept_tokens = text_truncate(text, settings.CHAT_ATTACHMENT_MAX_TOKENS, encode_text, total=tokens)
    return Extracted(
        name=name, kind=kind, data=data, sha256=hashlib.sha256(data).hexdigest(), text=kept,
        tokens=max(tokens, kept_tokens), prompt_tokens=kept_tokens, pages=pages,
        tokens_estimated=estimated,
    )  # fmt: skip


def upload_read(upload, *, encode_text: EncodeText) -> Extracted:
    """:func:`file_read` for a Django ``UploadedFile``, reading at most one byte more than the
    limit (a bigger file is refused without being read into memory)."""
    limit = settings.CHAT_ATTACHMENT_MAX_BYTES
    name = clean_name(getattr(upload, "name", None))
    if upload.size is not None and upload.size > limit:
        raise AttachmentRejected(
            413, "file_too_large",
            f"{name} is {size_text(upload.size)}; a file can be at most {size_text(limit)}. Attach "
            "a smaller file or only the part you need.",
        )  # fmt: skip
    upload.seek(0)
    data = upload.read(limit + 1)
    return file_read(name=name, data=data, encode_text=encode_text)
