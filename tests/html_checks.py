"""Find markup that could run script, with a real HTML parser (stdlib html.parser)."""

from __future__ import annotations

from html.parser import HTMLParser

DANGEROUS_TAGS = {"script", "svg", "iframe", "object", "embed", "math", "style", "base", "form"}


class _Collector(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.problems: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag in DANGEROUS_TAGS:
            self.problems.append(f"<{tag}> element")
        for name, value in attrs:
            if name.startswith("on"):
                self.problems.append(f"{name} attribute on <{tag}>")
            if name in {"href", "src", "action", "formaction", "xlink:href"} and value:
                if value.strip().lower().replace("\x00", "").startswith(("javascript:", "data:", "vbscript:")):
                    self.problems.append(f"{name}={value!r} on <{tag}>")


def dangerous_markup(html: str) -> list[str]:
    """Every element or attribute in ``html`` that could execute script (empty list: inert)."""
    collector = _Collector()
    collector.feed(html)
    collector.close()
    return collector.problems
