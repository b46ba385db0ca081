"""Answers in a real browser (issue 18, parts 2, 3 and 7): live Markdown while an answer streams,
as safe as the stored render (PF-X1) and identical to it when ``done`` arrives; highlighted code
blocks with a language label and Copy; Copy on an answer; the view follows a streaming answer
until the reader scrolls up, then offers "Jump to latest". Engine double, 1280x800; fixtures
and helpers come from chat_ui_support.py (one browser for the module)."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from core.rendering import markdown_to_safe_html
from tests.browser.chat_ui_support import (  # noqa: F401
    ANSWER,
    HOSTILE_DELTAS,
    STREAM_TEXT,
    TIMEOUT_MS,
    active_content,
    browser,
    send,
    stream_state,
    ui_login,
)

pytestmark = pytest.mark.browser

# navigator.clipboard.writeText, recorded: what a Copy button put on the clipboard.
CLIPBOARD_STUB = """
window.__copied = [];
Object.defineProperty(navigator, 'clipboard', {configurable: true, value: {
    writeText: (text) => { window.__copied.push(text); return Promise.resolve(); },
}});
"""


@pytest.fixture
def page(browser):  # noqa: F811
    """A 1280x800 page in a fresh context, its clipboard stubbed; uncaught page errors fail."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.set_default_timeout(TIMEOUT_MS)
    context.add_init_script(CLIPBOARD_STUB)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    yield page
    context.close()
    assert errors == [], f"uncaught JavaScript errors: {errors}"


def wait_streamed(page: Page, marker: str) -> None:
    """Until the streaming answer's text contains ``marker`` (and it is still streaming)."""
    page.wait_for_function(
        "([sel, marker]) => { const t = document.querySelector(sel);"
        " return t && t.textContent.includes(marker); }",
        arg=[STREAM_TEXT, marker],
    )
    assert stream_state(page)[1], "the answer should still be streaming"


def bubble_text(page: Page) -> str:
    return page.locator(f"{ANSWER} .bubble").inner_text()


RICH_DELTAS = [
    "Here is a **table**:\n\n| name | size |\n|---|--",
    "-:|\n| a | 1 |\n| b | 22 |\n\n",
    "- one\n- two with `code`\n  1. nested\n\n",
    "A poem line,\nand the next ~~one~~.\n\n> quoted [link](https://example.com) and ",
    "![chart](https://evil.example/x.png)\n\n",
    "```python\ndef f(x):\n    return x + 1  # add\n",
]
CODE_CLOSE = "```\n\nThat is all."


def test_live_markdown_renders_tables_lists_and_an_open_code_fence_while_streaming(live, engine_double, make_user, page):
    """Given a model that streams a table, a nested list and a code fence that is still open
    (the closing fence not yet sent), when the answer is half-way, then the streaming bubble
    already shows a table, list items and a highlighted python code block with its label,
    the image is a link (never loaded), and no raw Markdown syntax is visible."""
    engine_double.scripts.append([*RICH_DELTAS, 1.0, CODE_CLOSE, 0.3])
    make_user("lena")
    ui_login(page, live.url, "lena")

    send(page, "show me markdown")
    wait_streamed(page, "return x + 1")

    stream = page.locator(STREAM_TEXT)
    expect(stream.locator("table td")).to_have_count(4)
    expect(stream.locator("table td").nth(1)).to_have_text("1")
    expect(stream.locator("ul > li")).to_have_count(2)
    expect(stream.locator("ul ol > li")).to_have_text("nested")
    expect(stream.locator("s")).to_have_text("one")
    expect(stream.locator("blockquote a[href='https://example.com']")).to_have_text("link")
    expect(stream.locator("a[href='https://evil.example/x.png']")).to_have_text("chart")
    expect(stream.locator("img")).to_have_count(0)
    code = stream.locator(".code-block pre > code.language-python")
    expect(code).to_contain_text("def f(x):")
    expect(code.locator(".hljs-keyword").first).to_have_text("def")
    expect(stream.locator(".code-block .code-lang")).to_have_text("python")
    text = stream.inner_text()
    assert "```" not in text and "|---" not in text and "**" not in text
    assert stream_state(page)[1], "still streaming: the fence is open"


def test_pf_x1_payloads_streamed_as_live_markdown_stay_inert(live, engine_double, make_user, page):
    """PF-X1 during streaming: given a model whose output carries a <script>, an onerror <img>,
    a javascript: link and an onload <svg>, each split over deltas, and Markdown around them,
    when the answer is rendered live, then while it streams no script ran, no element has an
    event handler attribute, there is no script/svg/iframe element or javascript: link, and
    the payloads are shown as text."""
    engine_double.scripts.append(["# Title\n\n- item\n\n", *HOSTILE_DELTAS, 1.0])
    make_user("mallory")
    ui_login(page, live.url, "mallory")

    send(page, "be hostile")
    wait_streamed(page, "Done.")
    page.wait_for_timeout(300)  # time for any onerror/onload to fire

    stream = page.locator(STREAM_TEXT)
    expect(stream.locator("h1")).to_have_text("Title")  # it is rendered, not plain text
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert active_content(page) == []
    text = stream.inner_text()
    assert "<script>window.__pwned=1</script>" in text
    assert 'onerror="window.__pwned=2"' in text
    assert stream_state(page)[1], "the answer should still be streaming"


def test_text_a_reader_sees_is_identical_just_before_and_after_done(live, engine_double, make_user, page):
    """Given a streamed answer with a table, lists, a line break, strikethrough, a quote, an
    image and a code block, when `done` brings the stored HTML, then the answer's visible text
    (innerText, labels and buttons included) just before `done` equals the text just after, and
    the code block is still highlighted."""
    engine_double.scripts.append([*RICH_DELTAS, CODE_CLOSE, 0.8])
    make_user("otto")
    ui_login(page, live.url, "otto")

    send(page, "show me markdown")
    wait_streamed(page, "That is all.")
    page.wait_for_timeout(100)  # the frame that paints the last delta
    before = bubble_text(page)
    assert stream_state(page)[1], "the answer should still be streaming"

    expect(page.locator(f"{ANSWER}.complete")).to_have_count(1)
    after = bubble_text(page)

    assert "That is all." in before and "python" in before
    assert after == before
    expect(page.locator(f"{ANSWER} .bubble code .hljs-keyword").first).to_have_text("def")


PARITY_CASES = [
    "**bold**, *em*, `code`, ~~gone~~ and a [link](https://example.com \"t\")",
    "Roses are red,\nviolets are blue\n\n---\n\n> quote\n> more",
    "1. one\n2. two\n\n3) three\n\n5. five\n6. six\n\n- a\n  - b\n    - c",
    "| left | centre | right |\n|:---|:---:|---:|\n| a | b | c |\n| `x` | **y** | z |",
    "```js\nconst a = 1 < 2 && b > 3;\n```\n\n```\nplain\n```\n\n    indented code",
    '```"><img src=x onerror=alert(1)>\nx\n```\n\n```c++ extra words\nint a;\n```',
    "<script>alert(1)</script> <b>raw</b> <img src=x onerror=alert(1)>",
    "[x](javascript:alert(1)) [y](JAVASCRIPT:alert(1)) [z](data:text/html,hi) [m](mailto:a@b.c)",
    "![alt *text*](https://evil.example/i.png) <https://auto.example/link> <a@b.example>",
    "# H1\n## H2 with `code`\n###### H6\n\nSetext\n======",
    "&amp; &lt;tag&gt; &copy; &#x1F600; \\*not em\\* and a trailing backslash\\\nbreak",
    "[ref link][r]\n\n[r]: https://ref.example/ \"Ref\"",
    "```python\nunclosed fence\nstill code",
]


def test_live_renderer_agrees_with_the_stored_renderer(live, make_user, page):
    """Given the chat page's renderer (markdown-it + DOMPurify in the browser) and the server's
    (markdown-it-py + nh3), when both render the same Markdown (every feature the answers use,
    hostile input, an unclosed fence), then the browser parses both to the same DOM, so the
    swap on `done` changes nothing."""
    make_user("paula")
    ui_login(page, live.url, "paula")

    pairs = [[src, markdown_to_safe_html(src)] for src in PARITY_CASES]
    rendered = page.evaluate(
        """(pairs) => pairs.map(([src, server]) => {
            const a = document.createElement('div'); a.innerHTML = server;
            const b = document.createElement('div'); b.innerHTML = window.chatRender.markdown(src);
            return [a.innerHTML, b.innerHTML];
        })""",
        pairs,
    )

    mismatches = [(src, s, b) for src, (s, b) in zip(PARITY_CASES, rendered) if s != b]
    assert mismatches == []


def test_code_blocks_and_answers_have_copy_buttons_that_copy_their_text(live, engine_double, make_user, page):
    """Given a stored answer with a python code block, when the page is reloaded, then the code
    is highlighted with a "python" label; its Copy puts exactly the code on the clipboard and
    says "Copied"; the answer's Copy puts the answer's Markdown source there."""
    engine_double.scripts.append(["Try this:\n\n", "```python\nprint('hi')\n```\n\nDone."])
    make_user("cora")
    ui_login(page, live.url, "cora")
    send(page, "code please")
    expect(page.locator(f"{ANSWER}.complete")).to_have_count(1)

    page.reload()

    block = page.locator(f"{ANSWER} .code-block")
    expect(block.locator(".code-lang")).to_have_text("python")
    expect(block.locator("code .hljs-built_in")).to_have_text("print")
    block.locator("button.code-copy").click()
    expect(block.locator("button.code-copy")).to_have_text("Copied")
    page.locator(f"{ANSWER} button.copy-answer").click()
    expect(page.locator(f"{ANSWER} button.copy-answer")).to_have_text("Copied")
    assert page.evaluate("window.__copied") == [
        "print('hi')\n",
        "Try this:\n\n```python\nprint('hi')\n```\n\nDone.",
    ]


def test_live_answer_copy_button_copies_the_streamed_markdown(live, engine_double, make_user, page):
    """Given an answer streamed on this page, when it is done and the reader presses the
    answer's Copy, then its Markdown source is copied (as streamed, not the rendered text)."""
    engine_double.scripts.append(["A **bold** ", "claim."])
    make_user("lou")
    ui_login(page, live.url, "lou")
    send(page, "claim something")
    expect(page.locator(f"{ANSWER}.complete")).to_have_count(1)

    page.locator(f"{ANSWER} button.copy-answer").click()

    expect(page.locator(f"{ANSWER} button.copy-answer")).to_have_text("Copied")
    assert page.evaluate("window.__copied") == ["A **bold** claim."]


SCROLL_STATE = """() => {
    const m = document.getElementById('messages');
    return {top: m.scrollTop, gap: m.scrollHeight - m.clientHeight - m.scrollTop,
            height: m.scrollHeight, client: m.clientHeight,
            jump: !document.getElementById('jump-latest').hidden,
            streaming: !!document.querySelector('#messages article.streaming')};
}"""


def long_script(lines: int, pause_s: float) -> list:
    steps: list = []
    for i in range(lines):
        steps += [f"Line {i} of a long answer.\n\n", pause_s]
    return steps


def test_view_follows_a_streaming_answer_while_the_reader_is_at_the_bottom(live, engine_double, make_user, page):
    """Given an answer much taller than the view, when it streams and the reader does not
    scroll, then the view stays at the bottom the whole time and "Jump to latest" stays hidden."""
    engine_double.scripts.append(long_script(70, 0.03))
    make_user("finn")
    ui_login(page, live.url, "finn")

    send(page, "write a lot")
    wait_streamed(page, "Line 5 ")
    samples = []
    while (state := page.evaluate(SCROLL_STATE))["streaming"]:
        samples.append(state)
        page.wait_for_timeout(50)

    tall = [s for s in samples if s["height"] > s["client"] + 400]
    assert len(tall) >= 5, "the answer should outgrow the view while streaming"
    assert [s["gap"] for s in tall if s["gap"] > 32] == []
    assert not any(s["jump"] for s in samples)


def test_scrolling_up_stops_following_and_jump_to_latest_follows_again(live, engine_double, make_user, page):
    """Given a streaming answer taller than the view, when the reader scrolls up with the mouse
    wheel, then the view stays where they put it while text keeps arriving and "Jump to
    latest" appears; when they press it, the view is at the bottom and follows again."""
    engine_double.scripts.append(long_script(90, 0.04))
    make_user("gus")
    ui_login(page, live.url, "gus")

    send(page, "write a lot")
    wait_streamed(page, "Line 30 ")
    page.mouse.move(640, 300)
    page.mouse.wheel(0, -600)
    page.wait_for_timeout(400)
    scrolled = page.evaluate(SCROLL_STATE)
    wait_streamed(page, "Line 50 ")
    later = page.evaluate(SCROLL_STATE)

    assert scrolled["gap"] > 300
    assert abs(later["top"] - scrolled["top"]) <= 2, "the view moved while the reader read"
    assert later["height"] > scrolled["height"], "text kept arriving"
    expect(page.locator("#jump-latest")).to_be_visible()

    page.click("#jump-latest")
    expect(page.locator("#jump-latest")).to_be_hidden()
    wait_streamed(page, "Line 70 ")
    following = page.evaluate(SCROLL_STATE)
    assert following["gap"] <= 32
    assert following["top"] > later["top"]


def test_a_cut_off_answer_says_so_live_and_after_a_reload(live, engine_double, make_user, page, settings):
    """Given a completion budget of 3 tokens and a model that would say more, when the answer
    hits the cap mid-word, then it is not shown as complete: "Cut off at 3 tokens." appears
    when `done` arrives and again after a reload."""
    settings.CHAT_MAX_TOKENS = 3
    engine_double.scripts.append(["They ", "help", "s ", "more ", "words."])
    make_user("carl")
    ui_login(page, live.url, "carl")

    send(page, "tell me")

    expect(page.locator(f"{ANSWER}.complete [data-cut-off]")).to_have_text("Cut off at 3 tokens.")
    expect(page.locator(f"{ANSWER} .bubble")).to_have_text("They helps")
    page.reload()
    expect(page.locator(f"{ANSWER} [data-cut-off]")).to_have_text("Cut off at 3 tokens.")


def test_continue_appends_to_the_same_answer_and_it_stays_one_answer(live, engine_double, make_user, page, settings):
    """Given an answer cut off at 3 tokens, when the reader presses Continue, then the new text
    streams onto the end of the same answer (the cut-off text stays as it was, no second answer
    appears), the cut-off note goes, and after a reload it is still one answer with the whole
    text."""
    settings.CHAT_MAX_TOKENS = 3
    engine_double.scripts += [["They ", "help", "s ", "never"], ["a lot", 0.8, " more."]]  # 2 tokens: within the budget
    make_user("cleo")
    ui_login(page, live.url, "cleo")
    send(page, "tell me")
    expect(page.locator(f"{ANSWER}.complete [data-cut-off]")).to_have_text("Cut off at 3 tokens.")

    page.locator(f"{ANSWER} button.continue").click()

    wait_streamed(page, "a lot")
    expect(page.locator(ANSWER)).to_have_count(1)
    assert bubble_text(page).strip() == "They helps a lot"
    expect(page.locator(f"{ANSWER}.complete .bubble")).to_have_text("They helps a lot more.")
    expect(page.locator(f"{ANSWER} [data-cut-off]")).to_have_count(0)
    page.reload()
    expect(page.locator(ANSWER)).to_have_count(1)
    expect(page.locator(f"{ANSWER} .bubble")).to_have_text("They helps a lot more.")
    expect(page.locator(f"{ANSWER} button.continue")).to_have_count(0)


def test_painting_as_the_text_grows_gives_the_dom_of_one_paint_of_the_whole(live, engine_double, make_user, page):
    """render.js's paint keeps the blocks that render the same between frames; painting the
    answer prefix by prefix (a paragraph that becomes a heading, a table, a list, a code fence
    that opens before it closes) must end with exactly the DOM one paint of the whole text
    gives (decorated code blocks included), and every step's DOM must equal a fresh paint of
    that step's text."""
    make_user("pia")
    ui_login(page, live.url, "pia")
    text = "".join(RICH_DELTAS) + CODE_CLOSE + "\n\nTitle\n===\n\n- a\n\n- b\n"
    mismatches = page.evaluate(
        """(text) => {
            const grow = document.createElement('div'), bad = [];
            for (let n = 1; n <= text.length; n += 3) {
                const part = text.slice(0, n);
                window.chatRender.paint(grow, part);
                const once = document.createElement('div');
                window.chatRender.paint(once, part);
                if (grow.innerHTML !== once.innerHTML) bad.push(n);
            }
            window.chatRender.paint(grow, text);
            const once = document.createElement('div');
            window.chatRender.paint(once, text);
            if (grow.innerHTML !== once.innerHTML) bad.push(text.length);
            return bad;
        }""",
        text,
    )
    assert mismatches == []
