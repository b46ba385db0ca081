"""Documents for the project-file bench and tests (issue 30), written with the standard library.

- :func:`pdf_from_text`: a text PDF (Helvetica, WinAnsi, wrapped lines, as many US Letter pages as
  the text needs), optionally with incompressible image XObjects drawn on its pages to reach a
  size (the bench's 50 MB PDF: mostly pictures, some text, as real large PDFs are).
- :func:`docx_from_markdown`: a .docx whose paragraphs are the text's blank-line-separated blocks,
  Markdown headings as Word's "Heading N" styles, and ``docProps/app.xml`` with a page count.
- :func:`docx_bomb`: a .docx whose ``word/document.xml`` inflates to ``inflated`` bytes from a
  few hundred KB (one highly compressible run), streamed so building it holds one chunk.
"""

from __future__ import annotations

import io
import os
import re
import textwrap
import zipfile
from xml.sax.saxutils import escape

LINES_PER_PAGE = 54
CHARS_PER_LINE = 95


def _pdf_string(line: str) -> bytes:
    data = line.encode("cp1252", errors="replace")
    return b"(" + data.replace(b"\\", b"\\\\").replace(b"(", b"\\(").replace(b")", b"\\)") + b")"


def _pages(text: str) -> list[list[str]]:
    lines: list[str] = []
    for paragraph in text.split("\n"):
        lines += textwrap.wrap(paragraph, CHARS_PER_LINE) or [""]
    return [lines[i : i + LINES_PER_PAGE] for i in range(0, len(lines), LINES_PER_PAGE)] or [[]]


def pdf_from_text(text: str, *, pad_to_bytes: int = 0, image_bytes: int = 2 * 1024 * 1024) -> bytes:
    """A PDF showing ``text`` (one text line per source line, wrapped at 95 characters, 54 lines
    a page). ``pad_to_bytes``: add random-pixel RGB images of about ``image_bytes`` each, one per
    page from the first, until the file is at least that large (more pages are added, with a
    line of text each, when the text has too few)."""
    pages = _pages(text)
    images = max(0, -(-(pad_to_bytes - len(text)) // image_bytes)) if pad_to_bytes else 0
    while len(pages) < images:
        pages.append([f"Figure {len(pages) + 1}."])
    side = int((image_bytes // 3) ** 0.5)
    objects: list[bytes] = [b"<< /Type /Catalog /Pages 2 0 R >>", b"", b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>"]
    kids = []
    for index, lines in enumerate(pages):
        content = [b"BT /F1 10 Tf 13 TL 50 750 Td"]
        for line in lines:
            content.append(_pdf_string(line) + b" Tj T*")
        content.append(b"ET")
        xobject = b""
        if index < images:
            image_number = len(objects) + 1
            pixels = os.urandom(side * side * 3)
            objects.append(
                b"<< /Type /XObject /Subtype /Image /Width %d /Height %d /ColorSpace /DeviceRGB "
                b"/BitsPerComponent 8 /Length %d >>\nstream\n" % (side, side, len(pixels)) + pixels + b"\nendstream"
            )
            xobject = b" /XObject << /Im1 %d 0 R >>" % image_number
            content.append(b"q 200 0 0 200 350 40 cm /Im1 Do Q")
        stream = b"\n".join(content)
        objects.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
        contents_number = len(objects)
        objects.append(
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >>"
            + xobject + b" >> /Contents %d 0 R >>" % contents_number
        )
        kids.append(len(objects))
    objects[1] = b"<< /Type /Pages /Kids [%s] /Count %d >>" % (b" ".join(b"%d 0 R" % k for k in kids), len(kids))
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n" % number + body + b"\nendobj\n")
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    out.write(b"".join(b"%010d 00000 n \n" % offset for offset in offsets))
    out.write(b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref))
    return out.getvalue()


_W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
_CONTENT_TYPES = (
    '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
    '<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
    '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
    '<Default Extension="xml" ContentType="application/xml"/>'
    '<Override PartName="/word/document.xml" ContentType="application/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"/>'
    "</Types>"
)
_RELS = (
    '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
    '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
    '<Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/officeDocument" Target="word/document.xml"/>'
    "</Relationships>"
)


def _docx(document_xml_parts, pages: int | None = None, compress_level: int = 6) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=compress_level) as archive:
        archive.writestr("[Content_Types].xml", _CONTENT_TYPES)
        archive.writestr("_rels/.rels", _RELS)
        if pages is not None:
            archive.writestr(
                "docProps/app.xml",
                '<?xml version="1.0" encoding="UTF-8"?><Properties xmlns="http://schemas.openxmlformats.org/'
                f'officeDocument/2006/extended-properties"><Pages>{pages}</Pages></Properties>',
            )
        with archive.open("word/document.xml", "w", force_zip64=True) as part:
            for piece in document_xml_parts:
                part.write(piece)
    return out.getvalue()


def docx_from_markdown(text: str) -> bytes:
    """A .docx of ``text``: each blank-line-separated block a paragraph (its lines joined with
    line breaks), ``#`` headings as "Heading N" paragraphs."""
    paragraphs = []
    for block in re.split(r"\n\s*\n", text.strip()):
        heading = re.match(r"(#{1,6})\s+(.*)", block)
        if heading:
            style = f'<w:pPr><w:pStyle w:val="Heading{len(heading.group(1))}"/></w:pPr>'
            runs = f'<w:r><w:t xml:space="preserve">{escape(heading.group(2).strip())}</w:t></w:r>'
        else:
            style = ""
            runs = "<w:r><w:br/></w:r>".join(
                f'<w:r><w:t xml:space="preserve">{escape(line)}</w:t></w:r>' for line in block.split("\n")
            )
        paragraphs.append(f"<w:p>{style}{runs}</w:p>")
    xml = (
        f'<?xml version="1.0" encoding="UTF-8" standalone="yes"?><w:document xmlns:w="{_W}"><w:body>'
        + "".join(paragraphs) + "</w:body></w:document>"
    )  # fmt: skip
    return _docx([xml.encode()], pages=max(1, len(text) // 3000))


def docx_bomb(inflated: int) -> bytes:
    """A .docx whose ``word/document.xml`` is one run of ``inflated`` bytes of "A" (deflate
    squeezes it ~1,000 to 1), written 1 MiB at a time."""
    head = f'<?xml version="1.0"?><w:document xmlns:w="{_W}"><w:body><w:p><w:r><w:t>'.encode()
    tail = b"</w:t></w:r></w:p></w:body></w:document>"
    chunk = b"A" * (1024 * 1024)

    def parts():
        yield head
        left = inflated
        while left > 0:
            yield chunk[: min(left, len(chunk))]
            left -= len(chunk)
        yield tail

    return _docx(parts(), compress_level=9)
