"""A project chat's turn in the prompt (issue 30): the project's instructions in the system
message, the passages retrieved for the question in the last user message.

**Where each part goes, and why.** The project's instructions are the same for every turn of
every chat in the project, so they go into the one system message (inference/prompts.py
``system_message``: after the site's prompt, the user's custom instructions and the memory block,
before the conversation's own prompt and the summary); the prefix cache keeps them. The
passages change with each question, so they go into the *last* user message, before its text
(as attached files do, attachments/prompt.py), after every stable part of the prompt (system
message, earlier exchanges): a new question never invalidates the cached prefix. Each passage::

    [From project file: notes.md]
    ...the passage's text...
    [End of passage]

**Within the token budget.** Retrieval (projects/retrieval.py ``passages_retrieve``) keeps the
top k above a similarity floor within its own token budget; here the passages are kept, best
first, while they fit the room the prompt budget leaves after the system message, the attached
files and the question (``room``). Earlier exchanges are dropped before that
(inference/prompts.py ``prompt_assemble`` keeps the question, which holds the passages).

conversations/plan.py calls :func:`project_of` and :func:`project_passages`; the passages it used become the answer's
sources (projects/sources.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from attachments.prompt import neutralised

logger = logging.getLogger(__name__)

PASSAGE_HEADER = "[From project file: {name}]"
PASSAGE_FOOTER = "[End of passage]"
# Tokens kept free for what the separate counts cannot see (tokens merging across the joins).
MARGIN_TOKENS = 16


def question_with_passages(question: str, passages: Sequence) -> str:
    """The last user message: each passage's block (module docstring), best first, then
    ``question`` (just ``question`` without passages)."""
    if not passages:
        return question
    return "\n\n".join([*(passage_block(p.file_name, p.text) for p in passages), question])


def passage_block(name: str, text: str) -> str:
    """One passage's part of the message: its file's name in the header (no brackets, so it
    cannot close it), its text with chat-template special tokens neutralised."""
    header = PASSAGE_HEADER.format(name=name.replace("[", "(").replace("]", ")"))
    return "\n".join(part for part in (header, neutralised(text.strip()), PASSAGE_FOOTER) if part)


def passages_fitted(passages: Sequence, *, room: int, count_tokens: Callable[[str], int]) -> tuple:
    """The leading ``passages`` (best first) whose blocks fit in ``room`` tokens together; a
    passage's size is its stored ``tokens`` (the chat model's tokenizer) plus its frame
    (:func:`passage_block` of its name, empty, and the blank line after it; ``count_tokens``
    counts it). Stops at the first that does not fit, so the order stays the retrieval's."""
    kept = []
    left = room - MARGIN_TOKENS
    for passage in passages:
        size = passage.tokens + count_tokens(passage_block(passage.file_name, "") + "\n\n")
        if size > left:
            break
        kept.append(passage)
        left -= size
    return tuple(kept)


def project_of(conversation):
    """The project ``conversation`` is in (projects.models.Project, read from the conversation's
    database, where a project's chats live), or None (no query then). Read with each turn, so
    instructions edited a moment ago apply to the next turn."""
    if conversation is None or conversation.project_id is None:
        return None
    return conversation.project


def project_passages(
    *, project, question: str, room: int, count_tokens: Callable[[str], int], question_vector=None
) -> tuple:
    """The passages of ``project`` for ``question`` (text) that go into its prompt
    (projects.retrieval.Retrieved, best first; :func:`passages_fitted` in ``room`` tokens, what
    the prompt budget leaves after the system message, the files and the question;
    ``count_tokens``: text -> tokens with the answering pool's tokenizer). A retrieval failure
    (the embedding model, the database) is logged and gives (): retrieval is an extra, the
    answer must not fail for it. ``question_vector``: a Future of the question's embedding,
    started as the request arrived (conversations/plan.py ``amemory_query_start``), or None."""
    try:
        # Imported when used: retrieval loads the embedding model's module, which a turn outside
        # a project never needs.
        from projects.retrieval import passages_retrieve  # noqa: PLC0415

        vector = question_vector.result() if question_vector is not None and not question_vector.cancelled() else None
        found = passages_retrieve(project=project, question=question, vector=vector)
    except Exception:  # noqa: BLE001 - retrieval is an extra; the answer must not fail for it
        logger.exception("project retrieval failed for project %s", project.pk)
        return ()
    return passages_fitted(found, room=room, count_tokens=count_tokens)
