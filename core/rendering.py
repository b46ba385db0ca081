"""Assistant text -> safe HTML: Markdown (markdown-it-py, CommonMark) then a sanitiser (nh3).

Model output is untrusted input (PF-X1): raw HTML in it is escaped by the Markdown renderer
(``html`` off), and the result is sanitised again with an allow-list, so no script, no event
handler attribute and no ``javascript:`` URL survives even if a renderer bug let one through.

Images are rendered as links, never loaded: an answer steered by a prompt injection could
otherwise leak conversation text to another host through an image URL the browser fetches on its
own. Single line breaks are kept (``breaks``), as people write poems, lists and addresses.

A fenced code block keeps its language as ``class="language-<name>"`` on its ``<code>`` (what
the page's highlighter and language label read), and only when the name matches
:data:`LANGUAGE_CLASS`; every other class is dropped.

The chat page renders a streaming answer with the same renderer in the browser
(static/chat/render.js: markdown-it 14.1.0, the version markdown-it-py ports, with these options,
this image rule and this allow-list in DOMPurify), so the live and stored renders agree and
nothing jumps when the stored HTML replaces the live one. Change both together.
"""

from __future__ import annotations

import re

import nh3
from markdown_it import MarkdownIt
from markdown_it.common.utils import escapeHtml

_markdown = MarkdownIt("commonmark", {"html": False, "linkify": False, "breaks": True}).enable(
    ["table", "strikethrough"]
)


def _image_as_link(self, tokens, idx, options, env) -> str:
    """markdown-it render rule: ``![alt](src)`` -> ``<a href="src">alt</a>`` (no auto-load)."""
    token = tokens[idx]
    src = token.attrGet("src") or ""
    alt = self.renderInlineAsText(token.children or [], options, env) or src
    return f'<a href="{escapeHtml(src)}">{escapeHtml(alt)}</a>'


_markdown.add_render_rule("image", _image_as_link)

ALLOWED_TAGS = {
    "p", "br", "hr", "em", "strong", "s", "del", "code", "pre", "blockquote", "a",
    "ul", "ol", "li", "h1", "h2", "h3", "h4", "h5", "h6",
    "table", "thead", "tbody", "tr", "th", "td",
}  # fmt: skip
ALLOWED_ATTRIBUTES = {"a": {"href", "title"}, "ol": {"start"}, "code": {"class"}}
# A fence's language as markdown-it writes it; the same pattern is in static/chat/render.js.
LANGUAGE_CLASS = re.compile(r"language-[A-Za-z0-9_+#.-]{1,40}")


def _attribute_filter(element: str, attribute: str, value: str) -> str | None:
    """nh3 attribute filter: ``<code class>`` only as one fence language; else unchanged."""
    if attribute == "class":
        return value if element == "code" and LANGUAGE_CLASS.fullmatch(value) else None
    return value
ALLOWED_URL_SCHEMES = {"http", "https", "mailto"}


def markdown_to_safe_html(text: str) -> str:
    """Render Markdown ``text`` to sanitised HTML (a string safe to insert as innerHTML)."""
    html = _markdown.render(text or "")
    return nh3.clean(
        html,
        tags=ALLOWED_TAGS,
        attributes=ALLOWED_ATTRIBUTES,
        url_schemes=ALLOWED_URL_SCHEMES,
        attribute_filter=_attribute_filter,
        link_rel="noopener noreferrer nofollow",
    )
