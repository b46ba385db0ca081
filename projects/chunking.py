"""Cutting a file's text into passages for retrieval (issue 30). Pure functions; the tokenizer
is passed in (``count_tokens``: text -> tokens of the chat model), so this tests without an engine.

The rules, in order of precedence:

1. **Offsets are exact.** A passage is ``text[start:end]`` of the extracted text, so a source can
   be shown in place; nothing is rewritten inside it.
2. **Boundaries.** A passage is built from whole *units*: paragraphs (split on blank lines),
   Markdown heading lines, and, for a paragraph over the target, its lines and sentences; only a
   sentence longer than the target is cut, at a space. Units are packed greedily up to
   ``target_tokens``.
3. **Sections.** A Markdown heading (``#`` .. ``######`` at a line start; DOCX headings arrive
   as Markdown ones, projects/files.py) starts a new passage once the current one holds at least
   half the target, so a passage rarely straddles two sections.
4. **Overlap.** The next passage in the same section starts with the last units of the previous
   one, up to ``overlap_tokens``, so a fact cut at a boundary is whole in one of them.
5. **Headings travel.** Each passage records the headings it sits under (``heading``: "Lease >
   Rent > Late payment"); :meth:`Chunk.embedding_text` puts them before the text for the
   embedding only when ``CHAT_PROJECT_EMBED_HEADINGS`` (off by default: on the tuning questions
   of bench/data/projects it lowered hit rate at 5 from 0.979 to 0.936; chatsite/settings).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

CountTokens = Callable[[str], int]

_PARAGRAPH_BREAK = re.compile(r"\n[ \t\f]*\n\s*")
_HEADING = re.compile(r"(#{1,6})[ \t]+(\S.*?)[ \t#]*$")
# A sentence ends at . ! ? (optionally closed by quotes or brackets) followed by whitespace.
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+")


@dataclass(frozen=True)
class Chunk:
    """One passage: ``text == source[start:end]``; ``tokens``: its length by ``count_tokens``;
    ``heading``: the section headings it sits under, outermost first, joined by " > " ("" when
    none); ``ordinal``: its position in the file, from 0."""

    ordinal: int
    start: int
    end: int
    text: str
    tokens: int
    heading: str = ""

    def embedding_text(self, *, with_heading: bool = True) -> str:
        """What is embedded: the headings (when any and ``with_heading``), a blank line, the text."""
        if with_heading and self.heading:
            return f"{self.heading}\n\n{self.text}"
        return self.text


@dataclass(frozen=True)
class _Unit:
    start: int
    end: int
    tokens: int
    level: int = 0  # a heading's level (1-6); 0 for text
    title: str = ""


def chunk_text(
    text: str,
    *,
    count_tokens: CountTokens,
    target_tokens: int = 120,
    overlap_tokens: int = 25,
) -> list[Chunk]:
    """Passages of ``text`` by the rules of the module docstring. ``target_tokens`` (> 0): most
    tokens of a passage (a unit's count may exceed it by the few tokens a join adds);
    ``overlap_tokens`` (>= 0, < ``target_tokens``): most tokens repeated from the previous
    passage. Returns ``[]`` for a text with no non-space character. Costs about two encodes of
    the text (each unit once, each passage once)."""
    if target_tokens <= 0 or not 0 <= overlap_tokens < target_tokens:
        raise ValueError("target_tokens must be > 0 and 0 <= overlap_tokens < target_tokens")
    units = list(_units(text, count_tokens, target_tokens))
    chunks: list[Chunk] = []
    trail: list[tuple[int, str]] = []  # (level, title) of the headings in effect
    current: list[_Unit] = []
    current_trail: list[tuple[int, str]] = []
    fresh = 0  # units of ``current`` not yet in an emitted passage

    def emit() -> None:
        start, end = current[0].start, current[-1].end
        passage = text[start:end]
        heading_path = [t for level, t in current_trail]
        if current[0].level:  # it starts with its own heading: only the parents go before it
            heading_path = heading_path[:-1] if heading_path and heading_path[-1] == current[0].title else heading_path
        chunks.append(
            Chunk(ordinal=len(chunks), start=start, end=end, text=passage,
                  tokens=count_tokens(passage), heading=" > ".join(heading_path))
        )  # fmt: skip

    for unit in units:
        size = sum(u.tokens for u in current)
        section_break = unit.level and current and size >= target_tokens // 2
        if current and (section_break or size + unit.tokens > target_tokens):
            if fresh:
                emit()
            if section_break:
                current = []
            else:  # keep the tail as overlap
                kept, room = [], overlap_tokens
                for previous in reversed(current):
                    if previous.tokens > room or previous.level or len(kept) + 1 == len(current):
                        break
                    kept.insert(0, previous)
                    room -= previous.tokens
                while kept and sum(u.tokens for u in kept) + unit.tokens > target_tokens:
                    kept.pop(0)
                current = kept
            fresh = 0
        if unit.level:
            trail = [(level, title) for level, title in trail if level < unit.level]
            trail.append((unit.level, unit.title))
        if not current:
            current_trail = list(trail)
        current.append(unit)
        fresh += 1
    if current and fresh:
        emit()
    return chunks


def _units(text: str, count_tokens: CountTokens, target: int) -> Iterator[_Unit]:
    """Units in order (rule 2): a heading line alone; a run of other lines whole when it fits
    the target, else its lines, sentences and, for an over-long sentence, pieces cut at spaces."""
    for start, end in _paragraphs(text):
        run: tuple[int, int] | None = None
        for line_start, line_end in _lines(text, start, end):
            heading = _HEADING.match(text, line_start, line_end)
            if heading is None:
                run = (run[0], line_end) if run else (line_start, line_end)
                continue
            if run:
                yield from _text_units(text, *run, count_tokens, target)
                run = None
            yield _Unit(line_start, line_end, count_tokens(text[line_start:line_end]),
                        len(heading.group(1)), heading.group(2).strip())  # fmt: skip
        if run:
            yield from _text_units(text, *run, count_tokens, target)


def _paragraphs(text: str) -> Iterator[tuple[int, int]]:
    position = 0
    for found in _PARAGRAPH_BREAK.finditer(text):
        yield from _trimmed(text, position, found.start())
        position = found.end()
    yield from _trimmed(text, position, len(text))


def _trimmed(text: str, start: int, end: int) -> Iterator[tuple[int, int]]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    if start < end:
        yield start, end


def _lines(text: str, start: int, end: int) -> Iterator[tuple[int, int]]:
    position = start
    while position < end:
        newline = text.find("\n", position, end)
        stop = end if newline < 0 else newline
        yield from _trimmed(text, position, stop)
        position = stop + 1


def _text_units(text: str, start: int, end: int, count_tokens: CountTokens, target: int) -> Iterator[_Unit]:
    tokens = count_tokens(text[start:end])
    if tokens <= target:
        yield _Unit(start, end, tokens)
        return
    for line_start, line_end in _lines(text, start, end):
        for s, e in _sentences(text, line_start, line_end):
            tokens = count_tokens(text[s:e])
            if tokens <= target:
                yield _Unit(s, e, tokens)
            else:
                yield from _pieces(text, s, e, tokens, count_tokens, target)


def _sentences(text: str, start: int, end: int) -> Iterator[tuple[int, int]]:
    position = start
    for found in _SENTENCE_END.finditer(text, start, end):
        yield from _trimmed(text, position, found.start())
        position = found.end()
    yield from _trimmed(text, position, end)


def _pieces(text, start, end, tokens, count_tokens, target) -> Iterator[_Unit]:
    """An over-long sentence cut at spaces into pieces of at most ``target`` tokens (a run of
    characters with no space is cut anywhere). The piece width comes from the sentence's own
    characters per token, so the cost stays linear in its length."""
    width = max(1, (end - start) * target * 9 // (max(tokens, 1) * 10))
    position = start
    while position < end:
        stop = min(end, position + width)
        if stop < end:
            space = text.rfind(" ", position + 1, stop)
            stop = space if space > position else stop
        piece_tokens = count_tokens(text[position:stop])
        while piece_tokens > target and stop - position > 1:
            stop = position + (stop - position) * 3 // 4
            piece_tokens = count_tokens(text[position:stop])
        for s, e in _trimmed(text, position, stop):
            yield _Unit(s, e, count_tokens(text[s:e]))
        position = stop
        while position < end and text[position].isspace():
            position += 1
