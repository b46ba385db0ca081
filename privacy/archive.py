"""The mechanics of an export archive (privacy/export.py decides what goes in): a zip built in a
temporary file, and its data.json written piece by piece to a second one.

A zip entry must be written whole, and the Markdown and attachment entries are written while
data.json grows, so data.json goes to its own temporary file and is copied into the archive at
the end. Both live in ``settings.CHAT_PRIVACY_EXPORT_DIR`` (else the system's temporary folder)
and are deleted when closed; nothing is held in memory but the piece being written.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import logging
import shutil
import tempfile
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from typing import IO, Any

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.utils import timezone

logger = logging.getLogger(__name__)

COPY_BLOCK = 1 << 20  # bytes per copy of a file or of data.json into the archive

README = """\
This archive holds {what}, exported from chatsite on {when} (UTC).

data.json        everything, machine-readable ("format": "chatsite-export", "version": 1)
conversations/   each conversation as a Markdown file (the current version of each message
                 and the answer shown; every version is in data.json)
attachments/     the files sent in conversations, as uploaded, by conversation id

Share link tokens, API key secrets and session keys are not included.
"""


@dataclass
class Export:
    """A finished archive: ``file`` is an open temporary file at position 0 (deleted when
    closed), ``filename`` the name to offer, ``size`` its length in bytes."""

    file: IO[bytes]
    filename: str
    size: int


class ExportEncoder(DjangoJSONEncoder):
    """Django's JSON encoder, but times keep their microseconds (Django's cuts them to
    milliseconds, ECMA-262's precision): an export imported back (imports/) gives every turn
    the time it had, so the order of turns written within one millisecond is kept."""

    def default(self, o):
        if isinstance(o, dt.datetime):
            text = o.isoformat()
            return text[:-6] + "Z" if text.endswith("+00:00") else text
        return super().default(o)


def _json(value: Any, indent: int | None = 2) -> str:
    return json.dumps(value, cls=ExportEncoder, ensure_ascii=False, indent=indent)


class JsonStream:
    """Writes one JSON object to a text file a member at a time; arrays item by item, so an
    array of any length never has to be in memory."""

    def __init__(self, out: IO[str]):
        self.out = out
        self.first = True
        out.write("{")

    def _key(self, name: str) -> None:
        self.out.write("\n" if self.first else ",\n")
        self.first = False
        self.out.write(f"  {_json(name)}: ")

    def field(self, name: str, value: Any) -> None:
        self._key(name)
        self.out.write(_json(value).replace("\n", "\n  "))

    def array(self, name: str, items: Iterable[Any]) -> None:
        self._key(name)
        self.out.write("[")
        first = True
        for item in items:
            self.out.write("\n    " if first else ",\n    ")
            first = False
            self.out.write(_json(item).replace("\n", "\n    "))
        self.out.write("]" if first else "\n  ]")

    def close(self) -> None:
        self.out.write("\n}\n")


class ArchiveBuilder:
    """The zip being built in a temporary file, and its data.json in another."""

    def __init__(self):
        folder = settings.CHAT_PRIVACY_EXPORT_DIR or None
        self.file = tempfile.TemporaryFile(dir=folder)
        self.zip = zipfile.ZipFile(
            self.file, "w", compression=zipfile.ZIP_DEFLATED, allowZip64=True
        )
        self.json_file = tempfile.TemporaryFile(mode="w+", encoding="utf-8", dir=folder)
        self.data = JsonStream(self.json_file)
        self.names: set[str] = set()

    def unique(self, name: str) -> str:
        """``name``, or ``name`` with ``-2``, ``-3``... before its extension if taken."""
        stem, dot, ext = name.rpartition(".") if "." in name.rpartition("/")[2] else (name, "", "")
        candidate, n = name, 1
        while candidate in self.names:
            n += 1
            candidate = f"{stem}-{n}{dot}{ext}"
        self.names.add(candidate)
        return candidate

    def add_text(self, name: str, text: str) -> str:
        name = self.unique(name)
        self.zip.writestr(name, text.encode("utf-8"))
        return name

    def add_stored_file(self, name: str, storage, storage_name: str) -> str | None:
        """Copy a file from ``storage`` into the archive; None (logged) if it cannot be read."""
        try:
            source = storage.open(storage_name, "rb")
        except OSError:
            logger.warning("export: attachment file %s is missing", storage_name)
            return None
        name = self.unique(name)
        with source, self.zip.open(name, "w", force_zip64=True) as target:
            shutil.copyfileobj(source, target, COPY_BLOCK)
        return name

    def finish(self, *, filename: str, what: str) -> Export:
        """Close data.json, put it and README.txt in the archive, and hand the archive over."""
        self.data.close()
        self.json_file.seek(0)
        with self.zip.open("data.json", "w", force_zip64=True) as target:
            wrapped = io.TextIOWrapper(target, encoding="utf-8", write_through=True)
            shutil.copyfileobj(self.json_file, wrapped, COPY_BLOCK)
            wrapped.detach()
        self.json_file.close()
        self.zip.writestr(
            "README.txt", README.format(what=what, when=timezone.now().strftime("%Y-%m-%d %H:%M"))
        )
        self.zip.close()
        size = self.file.tell()
        self.file.seek(0)
        return Export(file=self.file, filename=filename, size=size)

    def abort(self) -> None:
        for f in (self.json_file, self.file):
            try:
                f.close()
            except Exception:  # noqa: BLE001 - closing a temporary file after a failure
                pass
