"""The plan of one answer to a conversation turn: the conversation's prompt assembly (history
from the turn path, the owner's memory, attached files), given to the gateway's one admission
sequence (gateway/admission.py ``admit``: route, shed, answer budget, prompt, rate limit, input
verdict, policy) as its prompt callback.

:func:`turn_plan` returns a :class:`TurnPlan`, which conversations/generate.py answers from.
Refusals are ``gate.Refused``; :class:`ContentBlocked` when the input gate stopped the message,
which is then stored with its verdict (conversations/submit.py).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from concurrent.futures import Future
from uuid import UUID

from asgiref.sync import sync_to_async
from django.conf import settings

from accounts.callers import caller_for
from attachments.prompt import question_with_files
from conversations import selectors, summaries
from conversations.models import Turn
from conversations.turnplan import TurnPlan
from gateway import admission, gate
from inference.pools import pool_engine
from inference.prompts import (
    chat_messages,
    kv_block_aligned,
    prompt_assemble,
    system_message,
)
from inference.router import Route
from inference.tool_format import ToolCalling, chat_encoder
from moderation.verdicts import Verdict
from projects.prompt import project_of, project_passages, question_with_passages

logger = logging.getLogger(__name__)

# vLLM's KV cache block on the CPU when none is set (vllm/platforms/cpu.py: block_size 128).
VLLM_CPU_BLOCK_SIZE = 128


class ContentBlocked(admission.InputBlocked):
    """The input gate stopped a message (moderation/): it is stored with status ``blocked``
    and its verdict (``question``), and never reaches the engine. A 400 ``content_blocked`` on
    /v1 with the categories and the stored turn's id; the page shows the message with why."""

    def __init__(self, question: Turn, verdict: Verdict):
        super().__init__(verdict, details={"turn_id": str(question.turn_id)})
        self.question = question


def _system_prompt(route: Route) -> str:
    """The first, most widely shared part of every turn's system message: the pool's preamble,
    then the site's prompt (settings.CHAT_SYSTEM_PROMPT). The owner's custom instructions, the
    memory block and the conversation's own prompt follow it (inference/prompts.py
    ``system_message``, in DESIGN.md's order)."""
    return gate.with_preamble(route, settings.CHAT_SYSTEM_PROMPT)


def _confidential_prompt(system_prompt: str, conversation) -> str:
    """The instructions the output gate's leak check guards (moderation/local.py
    ``leak_score``): the site's and the pool's, and the conversation's own. The owner's custom
    instructions are not among them: they are the reader's own words, and repeating them back
    to their author discloses nothing."""
    return "\n\n".join(p for p in (system_prompt, conversation.system_prompt.strip()) if p)


def _prompt_prepare(
    *,
    conversation_id: UUID,
    question: Turn,
    system_prompt: str,
    route: Route,
    max_tokens: int,
    planned: bool,
    last_turn_at=None,
    conversation=None,
    memory_query: Future | None = None,
    tools: ToolCalling | None = None,
    after_question: list[dict] | None = None,
) -> tuple[list[int], int, int, bool, tuple]:
    """Assemble the prompt for ``question`` within ``route``'s pool context (sync: reads the
    history and the owner's memory). ``conversation``: its owner's memory block goes into the
    prompt (:func:`_memory`: all their facts, or for an overflow user those most like the
    question); ``memory_query``: the question's embedding, started early
    (:func:`amemory_query_start`). ``tools``: the answer's function calling (its definitions end
    the system message, or go to a template with a tool format); ``after_question``: the tool
    rounds of the answer being written (OpenAI-shaped messages, conversations/toolrounds.py).
    In a project's chat, its instructions join the system message and the passages retrieved
    for the question (projects/prompt.py, by the same early embedding) go before the question.
    Returns (token ids, completion budget, context_trimmed, want_summary, the passages used).
    Raises PromptTooLong, Conversation.DoesNotExist."""
    owner = conversation.owner if conversation is not None else None
    # Read with the turn (the conversation and its owner are loaded per request): a change to
    # either applies from the next turn.
    instructions = {
        "custom_instructions": getattr(owner, "custom_instructions", "") or "",
        "conversation_prompt": conversation.system_prompt if conversation is not None else "",
    }
    project = project_of(conversation)
    instructions["project_instructions"] = project.instructions.strip() if project is not None else ""
    context = selectors.prompt_context(
        conversation_id=conversation_id, question=question, planned=planned, last_turn_at=last_turn_at,
        answer_choices=conversation.answer_choices if conversation is not None else None,
    )  # fmt: skip
    engine = pool_engine(route.pool)
    try:
        return _prompt_assembled(
            conversation_id=conversation_id, question=question, system_prompt=system_prompt, route=route,
            max_tokens=max_tokens, conversation=conversation, memory_query=memory_query, tools=tools,
            after_question=after_question, owner=owner, instructions=instructions, project=project,
            context=context, engine=engine,
        )  # fmt: skip
    finally:
        if memory_query is not None:
            memory_query.cancel()  # a no-op once used; else frees the embedding thread


def _prompt_assembled(
    *, conversation_id, question, system_prompt, route, max_tokens, conversation, memory_query, tools,
    after_question, owner, instructions, project, context, engine,
) -> tuple[list[int], int, int, bool, tuple]:
    """The assembly half of :func:`_prompt_prepare` (its arguments, read there)."""
    memory, relevant = _memory(owner, question.content, engine, memory_query) if owner is not None else ("", "")
    memory = memory_aligned(
        memory, route=route, engine=engine, system_prompt=system_prompt,
        custom_instructions=instructions["custom_instructions"],
    )  # fmt: skip
    # Tool calls and results in the history, and the tools, in the model's tool format.
    encode_chat, tools_section = chat_encoder(engine, tools)
    budget = route.pool.max_context - max_tokens
    system = system_message(system_prompt, **instructions)
    # Attached files (attachments/prompt.py) go into the question, within the budget; then the
    # project's passages in the room they leave (projects/prompt.py).
    asked = question_with_files(question, system_prompt=system, engine=engine, budget=budget)
    passages = ()
    if project is not None:
        passages = project_passages(
            project=project, question=question.content, question_vector=memory_query,
            room=budget - len(engine.encode_chat(chat_messages(system_prompt=system, question=asked))),
            count_tokens=lambda text: len(engine.encode_text(text)),
        )  # fmt: skip
    # Stable first, changing last (inference/prompts.py): preamble and site prompt, custom
    # instructions, memory, the project's instructions, the conversation's prompt, summary,
    # tools, turns.
    fitted = prompt_assemble(
        tools_section=tools_section,
        after_question=after_question or (),
        system_prompt=system_prompt,
        **instructions,
        memory=memory,
        summary=context.summary,
        exchanges=context.exchanges,
        question=with_relevant_memory(question_with_passages(asked, passages), relevant),
        encode_chat=encode_chat,
        max_model_len=route.pool.max_context,
        max_tokens=max_tokens,
    )
    return (
        fitted.token_ids,
        fitted.max_tokens,
        context.summarised + fitted.dropped_exchanges,
        summaries.summary_wanted(fitted),
        passages,
    )


RELEVANT_MEMORY_HEADING = "What you know about the user that may bear on this message:"


def with_relevant_memory(question: str, relevant: str) -> str:
    """The last user message with the facts relevant to it (``- fact`` lines) before its text.
    They go here, not into the system message: they change from turn to turn, and anything
    that changes in the system message would invalidate the cached history after it."""
    return f"{RELEVANT_MEMORY_HEADING}\n{relevant}\n\n{question}" if relevant.strip() else question


def _memory(user, query: str, engine, query_vector: Future | None = None) -> tuple[str, str]:
    """(memory block, relevant facts) for ``user``'s prompt answering ``query``.

    The block is the user's stored one, the same bytes in all their conversations
    (memory.blocks.memory_block_current): their pinned profile (name, how to be addressed,
    standing preferences such as diet; issue 28). The relevant facts are their other facts
    most like ``query`` above the relevance floor (memory.selectors.memory_relevant; "" for a
    turn they have nothing to do with), retrieved only when they have such facts
    (``query_vector``: the message's embedding, started early). For an overflow user (pinned
    facts over settings.CHAT_MEMORY_MAX_TOKENS) the block is the facts most like ``query``
    (memory.selectors.memory_block). ("", "") when memory is off (globally or for the user)
    or no fact is stored. A failure (e.g. the embedding model failing) is logged and the turn
    goes on without memory."""
    from memory.blocks import memory_block_current  # noqa: PLC0415 - loads the memory layer
    from memory.selectors import memory_block, memory_enabled_for, memory_relevant  # noqa: PLC0415

    def count(text: str) -> int:
        return len(engine.encode_text(text))

    try:
        if not memory_enabled_for(user):
            return "", ""
        block = memory_block_current(user_id=user.pk)
        if block.overflow:
            return memory_block(user=user, query=query, encode_tokens=count, query_vector=query_vector), ""
        relevant = ""
        if block.retrievable and settings.CHAT_MEMORY_RELEVANT_K > 0:
            relevant = memory_relevant(user=user, query=query, encode_tokens=count, query_vector=query_vector)
        return block.text, relevant
    except Exception:  # noqa: BLE001 - memory is an extra; the answer must not fail for it
        logger.exception("memory retrieval failed for user %s", user.pk)
        return "", ""


def kv_block_tokens() -> int:
    """The KV cache block size the memory block is aligned to, in tokens:
    ``CHAT_MEMORY_ALIGN_TOKENS`` when set (1: no alignment), else the local engine's block
    (``CHAT_ENGINE_BLOCK_SIZE``, or vLLM's CPU default of 128 when that is 0; a GPU node's
    default of 16 divides it, so a remote pool is aligned too)."""
    return settings.CHAT_MEMORY_ALIGN_TOKENS or settings.CHAT_ENGINE_BLOCK_SIZE or VLLM_CPU_BLOCK_SIZE


def memory_aligned(memory: str, *, route: Route, engine, system_prompt: str, custom_instructions: str) -> str:
    """``memory`` padded so the prefix every new chat of its user starts with (preamble, site
    prompt, custom instructions, memory block: :func:`new_chat_prefix`) ends on a KV block
    boundary (inference.prompts.kv_block_aligned, which says why), with ``route``'s pool's
    tokenizer (``engine``). Remembered per distinct input (an LRU of :data:`ALIGNED_MAX`
    entries, keyed by the pool's name and model version), so a turn tokenizes nothing for it
    after the user's first. Never raises: on any failure the memory goes in unpadded (logged)."""
    if not memory.strip():
        return memory
    key = (route.pool.name, route.pool.version, kv_block_tokens(), settings.CHAT_MEMORY_PROMPT_MAX_TOKENS,
           system_prompt, custom_instructions, memory)
    with _aligned_lock:
        found = _aligned.get(key)
        if found is not None:
            _aligned.move_to_end(key)
            return found
    try:
        aligned = _memory_aligned(memory, engine, system_prompt, custom_instructions, key[2])
    except Exception:  # noqa: BLE001 - an optimisation: the turn goes on with the block as it is
        logger.exception("could not align the memory block to the KV cache block")
        return memory
    with _aligned_lock:
        _aligned[key] = aligned
        while len(_aligned) > ALIGNED_MAX:
            _aligned.popitem(last=False)
    return aligned


ALIGNED_MAX = 4096
_aligned: OrderedDict[tuple, str] = OrderedDict()
_aligned_lock = threading.Lock()


def _shared_length(first: list[int], second: list[int]) -> int:
    """How many leading token ids ``first`` and ``second`` have in common."""
    shared = 0
    while shared < min(len(first), len(second)) and first[shared] == second[shared]:
        shared += 1
    return shared


def _memory_aligned(memory: str, engine, system_prompt: str, custom_instructions: str, block: int) -> str:
    def prompt(text: str, question: str) -> list[int]:
        return engine.encode_chat(
            chat_messages(system_prompt=system_prompt, memory=text, question=question,
                          custom_instructions=custom_instructions)
        )  # fmt: skip

    first, second = prompt(memory, "1"), prompt(memory, "2")
    after = len(first) - _shared_length(first, second)  # the question and what follows it: the same whatever the memory

    def prefix_tokens(text: str) -> int:
        return len(prompt(text, "1")) - after

    aligned = kv_block_aligned(memory, prefix_tokens=prefix_tokens, block_size=block)
    # Issue 28: memory adds at most CHAT_MEMORY_PROMPT_MAX_TOKENS to a turn (the user pays for
    # every prompt token, cached or not). Where the filler would break that, the block goes in
    # unpadded: a new chat then prefills the prefix's partial last block (< one KV block).
    if aligned != memory and prefix_tokens(aligned) - prefix_tokens("") > settings.CHAT_MEMORY_PROMPT_MAX_TOKENS:
        return memory
    return aligned


def new_chat_prefix(*, user, memory: str, caller: gate.Caller | None = None) -> tuple[Route, list[int]]:
    """The token ids every new chat of ``user`` starts with, and the route it takes: the
    templated prompt through the system message of the pool's preamble, the site prompt, the
    user's custom instructions and ``memory`` (their memory block), as a turn in a chat with no
    prompt of its own assembles it (:func:`_prompt_prepare`). Found as the longest common
    prefix of two such prompts that differ only in the question, so it ends where any question
    begins, whatever the chat template. The route is the user's default (a new chat's model is
    the tier's). ``caller``: ``user``'s (accounts/callers.py ``caller_for``; None: looked up).
    Sync (reads the user's organisation); tokenizes only, never starts an engine.
    conversations/prefix_warm.py sends it to the prefix cache, under the user's cache salt."""
    route = gate.route_for(caller or caller_for(user))
    engine = pool_engine(route.pool)
    system_prompt = _system_prompt(route)
    custom_instructions = getattr(user, "custom_instructions", "") or ""
    memory = memory_aligned(
        memory, route=route, engine=engine, system_prompt=system_prompt,
        custom_instructions=custom_instructions,
    )  # fmt: skip

    def prompt(question: str) -> list[int]:
        return engine.encode_chat(
            chat_messages(
                system_prompt=system_prompt, memory=memory, question=question,
                custom_instructions=custom_instructions,
            )
        )  # fmt: skip

    first, second = prompt("1"), prompt("2")
    return route, first[: _shared_length(first, second)]


def turn_prompt(
    *,
    conversation,
    question: Turn,
    planned: bool = False,
    memory_query: Future | None = None,
    continues_text: str = "",
    tools: ToolCalling | None = None,
    after_question: list[dict] | None = None,
) -> admission.PromptBuilder:
    """The prompt callback of an answer to ``question`` (gateway/admission.py ``PromptBuilder``):
    for the route and budget the gateway chose, the conversation's prompt (:func:`_prompt_prepare`,
    on the request's thread), its confidential instructions (:func:`_confidential_prompt`), and
    as ``detail`` (context_trimmed, want_summary). ``continues_text``, ``tools`` and
    ``after_question``: see :func:`turn_plan`.
    The callback raises PromptTooLong, or gate.Refused 400 ``context_length_exceeded`` when a
    continued answer leaves no room."""

    async def build(route: Route, budget: int) -> admission.Prompt:
        system_prompt = _system_prompt(route)
        # On the request's own thread and connection (thread-sensitive), not the shared
        # executor: a request waiting there would hold its connection meanwhile, and a burst of
        # turns could exhaust the connection pool.
        token_ids, budget, trimmed, want_summary, sources = await sync_to_async(_prompt_prepare)(
            conversation_id=conversation.conversation_id,
            question=question,
            system_prompt=system_prompt,
            route=route,
            max_tokens=budget,
            planned=planned,
            last_turn_at=conversation.last_turn_at,
            conversation=conversation,
            memory_query=memory_query,
            tools=tools,
            after_question=after_question,
        )
        if continues_text:
            token_ids = token_ids + pool_engine(route.pool).encode_text(continues_text)
            room = route.pool.max_context - len(token_ids)
            if room < 1:
                raise gate.Refused(
                    400, "context_length_exceeded", "This answer is as long as the model can write here."
                )
            budget = min(budget, room)
        return admission.Prompt(
            token_ids=token_ids, max_tokens=budget,
            confidential=_confidential_prompt(system_prompt, conversation),
            detail=(trimmed, want_summary, sources),
        )  # fmt: skip

    return build


async def turn_plan(
    *,
    conversation,
    caller: gate.Caller,
    question: Turn,
    model: str | None = None,
    max_tokens: int | None = None,
    explicit_max_tokens: bool = False,
    planned: bool = False,
    memory_query: Future | None = None,
    continues_text: str = "",
    checked_text: str | None = None,
    tools: ToolCalling | None = None,
    after_question: list[dict] | None = None,
) -> TurnPlan:
    """Admit an answer to ``question`` through the gateway's admission sequence
    (gateway/admission.py ``admit``: route, shed, budget, this conversation's prompt, rate limit,
    input verdict, policy), with :func:`turn_prompt` as its prompt callback. No engine work and
    nothing stored. ``model``: asked for by this request, checked strictly; else the
    conversation's ``model``. ``planned``: ``question`` is not stored yet. ``memory_query``: the
    question's embedding for memory retrieval, started when the request arrived
    (:func:`amemory_query_start`); None: embedded during assembly if retrieval needs it.
    ``continues_text``: the text of a cut-off answer being continued (Continue, issue 18): its
    tokens end the prompt, so the model goes on from them, they count towards the rate limits as
    prompt tokens, and the completion budget is what the pool's context leaves after them (at
    most the usual one). ``checked_text``: the new message, for the input gate (None: no check,
    the question was checked when it was stored). ``tools``: the answer's function calling
    (inference/tool_format.py): the definitions are part of the prompt, so they count as prompt
    tokens for the rate limits and the cost like any other; ``after_question``: the tool rounds
    of the answer being written after its calls' results (conversations/toolrounds.py).
    Raises gate.Refused (400/403/404/429/503; 400 context_length_exceeded for a prompt longer
    than the pool's context), admission.InputBlocked when the input gate flags ``checked_text``
    (the caller stores the message with its verdict)."""
    plan = await admission.admit(
        caller=caller, model=model, fallback_model=conversation.model, max_tokens=max_tokens,
        explicit_max_tokens=explicit_max_tokens, checked_text=checked_text,
        build_prompt=turn_prompt(
            conversation=conversation, question=question, planned=planned, memory_query=memory_query,
            continues_text=continues_text, tools=tools, after_question=after_question,
        ),
    )  # fmt: skip
    trimmed, want_summary, sources = plan.prompt.detail
    return TurnPlan(
        admitted=plan.admitted, token_ids=plan.prompt.token_ids, max_tokens=plan.prompt.max_tokens,
        context_trimmed=trimmed, want_summary=want_summary, verdict=plan.verdict, tools=tools,
        sources=sources,
    )  # fmt: skip


def memory_query_start(text: str) -> Future | None:
    """Start embedding ``text`` (a new user message) for long-term memory retrieval now, on the
    embedding thread (inference.embeddings.embed_one_start), so its ~10 ms run while the request
    claims the conversation, loads the caller and the history; prompt assembly then only waits
    for what is left of it. None when memory is off for the service
    (settings.CHAT_MEMORY_ENABLED) or the text is blank; a turn that does not retrieve cancels
    it unused (:func:`_memory`)."""
    if not settings.CHAT_MEMORY_ENABLED or not text.strip():
        return None
    from inference.embeddings import embed_one_start  # noqa: PLC0415 - loads the embedding layer

    return embed_one_start(text)


async def amemory_query_start(text: str, *, user_id, in_project: bool = False) -> Future | None:
    """:func:`memory_query_start` for a message of user ``user_id``, only when their turn may
    retrieve (issue 19: query-time retrieval is for overflow users, started as the request
    arrives, overlapped with admission): not when their stored memory block is current and
    within budget (memory.blocks.amemory_block_needs_query, one primary-key read), which is the
    common case and then embeds nothing. ``in_project``: the message is in a project's chat,
    whose passages are retrieved by the same embedding (projects/prompt.py): always started."""
    if in_project and text.strip():
        from inference.embeddings import embed_one_start  # noqa: PLC0415 - loads the embedding layer

        return embed_one_start(text)
    if not settings.CHAT_MEMORY_ENABLED or not text.strip():
        return None
    from memory.blocks import amemory_block_needs_query  # noqa: PLC0415 - loads the memory layer

    if not await amemory_block_needs_query(user_id=user_id):
        return None
    return memory_query_start(text)
