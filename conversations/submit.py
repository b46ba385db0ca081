"""A user's message in, an answer started: the conversation entrypoint of the one turn pipeline.

:func:`turn_submit` (a new message, or an edit), :func:`answer_regenerate` (answer a question
again), :func:`answer_continue` (go on with a cut-off answer) and :func:`tool_results_submit`
(the results of an answer's tool calls, then the answer after them) claim the conversation
(conversations/locks.py), admit the answer through the gateway's one admission sequence
(gateway/admission.py: route, shed, budget, the conversation's prompt from conversations/plan.py,
rate limit, input verdict, policy), store the message, and start the generation
(conversations/generate.py). The chat page and
``/v1/conversations/{id}/turns`` both call these; they only parse and render.
"""

from __future__ import annotations

import logging

from asgiref.sync import sync_to_async
from django.conf import settings
from django.utils import timezone

from accounts.callers import acaller_of
from conversations import answer_lock, cache, selectors, services, toolrounds, versions
from conversations.generate import generation_start
from conversations.locks import conversation_claim
from conversations.models import Turn
from conversations.plan import ContentBlocked, amemory_query_start, turn_plan
from conversations.selectors import conversation_zero_retention
from conversations.toolrounds import ToolResultsInvalid  # noqa: F401 - re-exported: a refusal
from conversations.turnstream import TurnStream
from core.regions import new_turn_id
from gateway import gate
from gateway.admission import InputBlocked
from inference.tool_format import ToolCalling
from projects.services import turn_sources_store

logger = logging.getLogger(__name__)


async def turn_submit(
    *,
    conversation,
    content: str,
    caller: gate.Caller | None = None,
    model: str | None = None,
    max_tokens: int | None = None,
    explicit_max_tokens: bool = False,
    replaces: Turn | None = None,
    tools: ToolCalling | None = None,
) -> tuple[Turn, TurnStream]:
    """Store a user message and start answering it; returns (user turn, answer stream).

    ``caller``: whose tier, limits and pins apply (default: the conversation's owner in its
    organisation). ``model``: the pool this message asks for (becomes the conversation's
    model); ``max_tokens`` / ``explicit_max_tokens``: see gateway/gate.py ``answer_budget``. ``replaces``: the
    user turn this message edits (a user turn of this conversation, checked by the caller);
    the edit is a new turn in its place (conversations/versions.py). ``tools``: the function
    calling asked for the answer (inference/tool_format.py; checked by the caller).

    The conversation is claimed *before* anything is written (check and claim with no await
    between them, so atomic in the event loop): of two messages sent at the same moment one is
    answered and the other gets ConversationBusy with nothing stored (PF-P1). The answer is
    admitted (:func:`turn_plan`: route, shed, prompt, rate limits) before the message is
    stored, so a refused message leaves nothing behind.
    The message then passes the input moderation gate: a flagged one is stored with its
    verdict and status ``blocked`` and never answered (ContentBlocked); a failed check refuses
    the turn with nothing stored (503, unless the organisation chose fail-open).
    Raises ValidationError for an invalid message, ConversationBusy while an answer is written,
    gate.Refused when the answer is not admitted (ContentBlocked when moderation stopped it).
    """
    conversation_id = conversation.conversation_id
    answer_id = new_turn_id(conversation.conversation_id)
    text = services.message_clean(content)
    # An overflow user's memory retrieval and a project's passages embed the message now, beside
    # the claim, caller and history reads (otherwise nothing is embedded).
    memory_query = await amemory_query_start(
        text, user_id=conversation.owner_id, in_project=conversation.project_id is not None
    )
    caller = await acaller_of(conversation, caller)
    async with conversation_claim(conversation_id, answer_id):
        # Where it goes in the turn tree: after the branch shown, or beside the message it edits.
        parent_id = await sync_to_async(selectors.new_message_parent)(
            conversation=conversation, replaces=replaces
        )
        draft = Turn(
            conversation_id=conversation_id, role=Turn.Role.USER, content=text,
            replaces_id=replaces.turn_id if replaces is not None else None, parent_id=parent_id,
        )  # fmt: skip
        # The input gate checks the message beside admission (gateway/admission.py); a check
        # that itself failed refuses the turn with nothing stored (503, PF-M2).
        try:
            plan = await turn_plan(
                conversation=conversation, caller=caller, question=draft, model=model,
                max_tokens=max_tokens, explicit_max_tokens=explicit_max_tokens, planned=True,
                memory_query=memory_query, checked_text=text, tools=tools,
            )  # fmt: skip
        except InputBlocked as exc:  # stored with its verdict; the engine never sees it
            question = await _question_store(
                conversation, text, replaces=replaces, parent_id=parent_id, model=model, verdict=exc.verdict
            )
            raise ContentBlocked(question, exc.verdict) from None
        try:
            question = await _question_store(
                conversation, text, replaces=replaces, parent_id=parent_id, model=model, verdict=plan.verdict
            )
        except BaseException:
            await gate.settle(plan.decision, prompt_tokens=0, completion_tokens=0)
            raise
        await _memory_commands(conversation, question)
        stream = await _answer_start(conversation, question, plan, answer_id)
    return question, stream


async def _question_store(conversation, text: str, *, replaces, parent_id, model, verdict) -> Turn:
    """Store the user's message with the input gate's ``verdict`` (blocked when it is flagged),
    make ``model`` the conversation's, and write it through to the hot cache
    (conversations/cache.py; never raises). Raises what the stores raise."""
    previous_turn_at = conversation.last_turn_at  # the append moves it
    question = await sync_to_async(services.turn_append_user)(
        conversation=conversation, content=text, replaces=replaces, parent_id=parent_id,
        moderation_verdict=verdict.as_json() if verdict is not None else None,
        blocked=verdict is not None and verdict.flagged,
    )  # fmt: skip
    if model and model != conversation.model:
        await sync_to_async(services.conversation_model_set)(conversation=conversation, model=model)
    await cache.aturn_cached(question, after=previous_turn_at)
    return question


async def _memory_commands(conversation, question: Turn) -> None:
    """Apply the message's explicit memory requests ("remember that I ...", "forget that ...",
    "call me ...") at once, before its answer starts (memory/updates.py), so the chat can show
    "Memory updated" under that answer. Not in a temporary or zero-retention chat (nothing of
    it is kept). A failure is logged: the answer must not fail for memory."""
    from memory.commands import commands_parse  # noqa: PLC0415 - loads the memory layer
    from memory.updates import memory_commands_apply  # noqa: PLC0415

    # A pure parse first: a message with no request (nearly all) costs no query here.
    if conversation.temporary or not settings.CHAT_MEMORY_ENABLED or not commands_parse(question.content):
        return
    if await sync_to_async(conversation_zero_retention)(conversation):
        return

    def apply() -> None:
        owner = conversation.owner
        memory_commands_apply(user=owner, conversation_id=conversation.conversation_id, turn=question)

    try:
        await sync_to_async(apply)()
    except Exception:  # noqa: BLE001 - memory is an extra
        logger.exception("memory commands of turn %s failed", question.turn_id)


async def answer_regenerate(
    *,
    conversation,
    answer: Turn,
    caller: gate.Caller | None = None,
    model: str | None = None,
    max_tokens: int | None = None,
    explicit_max_tokens: bool = False,
) -> tuple[Turn, TurnStream]:
    """Answer ``answer``'s question again; returns (that question, the new answer's stream).

    Append-only (conversations/versions.py): the new answer is a new assistant turn with
    ``replaces`` = ``answer`` and the same ``reply_to``; the old one stays as an earlier
    version. Claimed and admitted as in :func:`turn_submit` (PF-P1). ``answer`` must be an
    assistant turn of ``conversation`` (checked by the caller).

    An answer written after tool calls (conversations/toolrounds.py) is written again from the
    same calls and results: the new version also ``continues`` the calling answer and its
    prompt ends with the same rounds (``after_question``), so the model writes the final answer
    again rather than calling the tools again. No tools are offered to it (tools are per
    request, and a call now would have no client to answer it).
    Raises ConversationBusy while an answer is written, Http404 if its question is gone,
    gate.Refused when not admitted.
    """
    conversation_id = conversation.conversation_id
    answer_id = new_turn_id(conversation.conversation_id)
    caller = await acaller_of(conversation, caller)
    async with conversation_claim(conversation_id, answer_id):
        question = await sync_to_async(selectors.user_turn_get)(
            conversation=conversation, turn_id=answer.reply_to_id
        )
        calling, rounds = await _rounds_before(conversation, answer)
        plan = await turn_plan(
            conversation=conversation, caller=caller, question=question, model=model,
            max_tokens=max_tokens, explicit_max_tokens=explicit_max_tokens, after_question=rounds,
        )  # fmt: skip
        stream = await _answer_start(
            conversation, question, plan, answer_id, replaces_id=answer.turn_id, continues=calling
        )
    return question, stream


async def _rounds_before(conversation, answer: Turn) -> tuple[Turn | None, list[dict] | None]:
    """For an answer written after tool calls (a continuation of one included): (the last
    calling answer it follows, the rounds' messages for the prompt's ``after_question``); (None,
    None) for any other answer (no query when it continues nothing)."""
    if getattr(answer, "continues_id", None) is None:
        return None, None
    turns = await sync_to_async(selectors.turn_list)(conversation=conversation)
    by_id = {t.turn_id: t for t in turns}
    chain = toolrounds.calls_before(answer, by_id)
    if not chain:  # a Continue of a plain cut-off answer: from the question, as before
        return None, None
    return chain[-1], toolrounds.round_messages(chain, toolrounds.results_by_call_turn(turns))


async def answer_continue(
    *,
    conversation,
    answer: Turn,
    caller: gate.Caller | None = None,
) -> tuple[Turn, TurnStream]:
    """Continue ``answer``, an answer cut off at its token budget (finish_reason ``length``);
    returns (its question, the continuation's stream).

    Append-only (conversations/versions.py): the continuation is a new assistant turn with
    ``continues`` = ``answer`` and the same ``reply_to``, whose text is ``answer``'s then the
    new; it stands in for ``answer`` (shown as one answer). The engine is prompted with the
    question's prompt plus ``answer``'s text, so it goes on mid-sentence; the completion budget
    is what the pool's context leaves after that (at most the usual one) and the rate limits
    count that text as prompt tokens (:func:`turn_plan`'s ``continues_text``). An answer written
    after tool calls (conversations/toolrounds.py) is continued from the prompt it was written
    from: the question, then the calling answers, their calls and results (``after_question``,
    rendered in the model's tool format as when it was written), then its text. No tools are
    offered (as for a regenerated one: a call now would have no client to answer it). Claimed and
    admitted as in :func:`turn_submit` (PF-P1). Raises gate.Refused (400 ``not_cut_off``) for an answer
    that was not cut off, (400 ``context_length_exceeded``) when no room is left to continue,
    ConversationBusy while an answer is written, Http404 if its question is gone.
    """
    if answer.role != Turn.Role.ASSISTANT or answer.finish_reason != "length" or answer.status != Turn.Status.COMPLETE:
        raise gate.Refused(400, "not_cut_off", "Only an answer that was cut off can be continued.")
    conversation_id = conversation.conversation_id
    answer_id = new_turn_id(conversation.conversation_id)
    caller = await acaller_of(conversation, caller)
    async with conversation_claim(conversation_id, answer_id):
        question = await sync_to_async(selectors.user_turn_get)(
            conversation=conversation, turn_id=answer.reply_to_id
        )
        _, rounds = await _rounds_before(conversation, answer)
        plan = await turn_plan(
            conversation=conversation, caller=caller, question=question, continues_text=answer.content,
            after_question=rounds,
        )  # fmt: skip
        stream = await _answer_start(conversation, question, plan, answer_id, continues=answer)
    return question, stream


async def answer_now(*, conversation, question: Turn, caller: gate.Caller | None = None) -> TurnStream:
    """Answer ``question``, a stored user turn of ``conversation`` that has no answer and none
    being written (e.g. its server restarted mid-answer), here and now; returns the stream.
    Claimed (cross-process lock) and admitted as in :func:`turn_submit`, so two processes that
    both find it unanswered never answer it twice. Raises ConversationBusy if another answer
    holds the conversation, gate.Refused when not admitted."""
    answer_id = new_turn_id(conversation.conversation_id)
    caller = await acaller_of(conversation, caller)
    async with conversation_claim(conversation.conversation_id, answer_id):
        plan = await turn_plan(conversation=conversation, caller=caller, question=question)
        return await _answer_start(conversation, question, plan, answer_id)


async def _answer_start(
    conversation, question: Turn, plan, answer_id, replaces_id=None, continues: Turn | None = None
) -> TurnStream:
    """Start the answer under the caller's claim, keeping nothing at rest for a zero-retention
    conversation (conversations/generate.py ``generation_start``). A new version of an answer
    (Regenerate, Continue) is the one to see: an older version chosen for the question is
    forgotten (services.answer_select). In a project chat the passages its prompt holds are
    stored as the answer's sources (projects/sources.py) once it is generating, so its page
    shows them."""
    if (replaces_id or continues) and str(question.turn_id) in conversation.answer_choices:
        await sync_to_async(services.answer_select)(
            conversation=conversation, question_id=question.turn_id, answer_id=None
        )
    zero_retention = await sync_to_async(conversation_zero_retention)(conversation)
    stream = generation_start(
        conversation_id=conversation.conversation_id,
        question=question,
        plan=plan,
        answer_id=answer_id,
        zero_retention=zero_retention,
        replaces_id=replaces_id,
        claimed=True,
        continues=continues,
    )
    if plan.sources and not zero_retention:
        try:
            await sync_to_async(turn_sources_store)(
                conversation=conversation, question_id=question.turn_id, answer_id=stream.answer_id,
                passages=plan.sources,
            )  # fmt: skip
        except Exception:  # noqa: BLE001 - the list under the answer; the answer goes on
            logger.exception("could not store the sources of answer %s", stream.answer_id)
    return stream


async def tool_results_submit(
    *,
    conversation,
    results: list[tuple[str, str]],
    caller: gate.Caller | None = None,
    tools: ToolCalling | None = None,
    model: str | None = None,
    max_tokens: int | None = None,
    explicit_max_tokens: bool = False,
) -> tuple[list[Turn], TurnStream | None]:
    """Store ``results`` ((tool_call_id, content) pairs) for the calls of the answer the branch
    shown ends with, as ``tool`` turns, and once every call of it has a result start the answer
    after them (conversations/toolrounds.py); returns (the tool turns, that answer's stream, or
    None while calls still await results).

    The next answer continues the calling one (``continues``, same question) and its prompt is
    the question's with the calls and results after it (``after_question``), rendered in the
    model's tool format; ``tools``: the function calling asked for it (tools are per request).
    The results pass the input gate as a message does. Claimed and admitted as in
    :func:`turn_submit` (PF-P1): a refused answer leaves the results unstored. Raises
    ToolResultsInvalid (a 400: the latest answer made no calls, an id that matches none of its
    calls, a result given twice or already), ConversationBusy, gate.Refused.
    """
    conversation_id = conversation.conversation_id
    answer_id = new_turn_id(conversation_id)
    caller = await acaller_of(conversation, caller)
    async with conversation_claim(conversation_id, answer_id):
        turns = await sync_to_async(selectors.turn_list)(conversation=conversation)
        calling = _calling_answer(conversation, turns)
        earlier = toolrounds.results_by_call_turn(turns).get(calling.turn_id, []) if calling is not None else []
        toolrounds.tool_results_check(calling, earlier, [call_id for call_id, _ in results])
        drafts = [Turn(role=Turn.Role.TOOL, tool_call_id=call_id, content=content) for call_id, content in results]
        if toolrounds.pending_calls(calling, [*earlier, *drafts]):
            stored = await _tool_results_store(conversation, calling, results)
            await answer_lock.conversation_unlock(conversation_id, answer_id)  # no answer follows yet
            return stored, None
        question = await sync_to_async(selectors.user_turn_get)(conversation=conversation, turn_id=calling.reply_to_id)
        by_id = {t.turn_id: t for t in turns}
        chain = [*toolrounds.calls_before(calling, by_id), calling]
        answered = toolrounds.results_by_call_turn([*turns, *_drafted(drafts, calling)])
        plan = await turn_plan(
            conversation=conversation, caller=caller, question=question, model=model, max_tokens=max_tokens,
            explicit_max_tokens=explicit_max_tokens, tools=tools, checked_text="\n\n".join(c for _, c in results),
            after_question=toolrounds.round_messages(chain, answered),
        )  # fmt: skip
        try:
            stored = await _tool_results_store(conversation, calling, results)
        except BaseException:
            await gate.settle(plan.decision, prompt_tokens=0, completion_tokens=0)
            raise
        stream = await _answer_start(conversation, question, plan, answer_id, continues=calling)
    return stored, stream


def _calling_answer(conversation, turns: list[Turn]) -> Turn | None:
    """The answer the branch shown ends with (the last position's answer shown), or None."""
    positions = versions.positions_build(turns, conversation.branch_choices, conversation.answer_choices)
    return positions[-1].answer if positions else None


def _drafted(drafts: list[Turn], calling: Turn) -> list[Turn]:
    """``drafts`` as results of ``calling``'s calls, timed now (for ordering only; unsaved)."""
    now = timezone.now()
    for turn in drafts:
        turn.reply_to_id, turn.created_at = calling.turn_id, now
    return drafts


async def _tool_results_store(conversation, calling: Turn, results: list[tuple[str, str]]) -> list[Turn]:
    """Store the results as tool turns (services.turn_append_tools) and write them through to
    the hot cache (conversations/cache.py; never raises)."""
    previous_turn_at = conversation.last_turn_at
    stored = await sync_to_async(services.turn_append_tools)(conversation=conversation, answer=calling, results=results)
    for turn in stored:
        await cache.aturn_cached(turn, after=previous_turn_at)
        previous_turn_at = turn.created_at
    return stored
