"""Function calling on ``/v1/chat/completions`` (issue 30, part 1), as OpenAI documents it
("Function calling"; the chat completion object's ``tool_calls``, ``finish_reason:
"tool_calls"`` and the chunk object's tool-call deltas).

**The request.** ``tools`` (functions with a JSON Schema of their arguments), ``tool_choice``
(``none``, ``auto`` (the default when tools are given), ``required``, or one named function),
``parallel_tool_calls``; assistant messages carry ``tool_calls`` and ``tool`` messages carry
``tool_call_id``, the id of the call they answer. :func:`tool_calling` checks all of it and
refuses with a 400 that names the field: a ``parameters`` that is not a JSON Schema (or not an
object's), two functions of one name, a named function not in ``tools``, ``required`` or a
named function without tools, a ``tool`` message whose id matches no earlier call.

**The prompt and the answer**: inference/tool_format.py, the one Hermes renderer and parser
(also used by conversation turns): the tools section in the system message, calls written back
as ``<tool_call>`` blocks and results as ``<tool_response>`` blocks, ``required`` and a named
function constrained by structured output, ``auto`` read from the blocks the model writes,
streamed by :class:`ToolStream`.

The same checks serve ``POST /v1/conversations/{id}/turns`` (:func:`calling_from`), which takes
``tools``, ``tool_choice`` and ``parallel_tool_calls`` with a user message or tool results.
"""

from __future__ import annotations

from jsonschema import exceptions as schema_errors
from jsonschema import validators

from api import schemas
from core.errors import ApiError
from inference.tool_format import TOOLS_HEADER, ToolCalling, ToolStream, hermes_messages

__all__ = [
    "TOOLS_HEADER", "ToolCalling", "ToolStream", "calling_from", "json_schema_check", "messages_check",
    "prompt_messages", "tool_calling",
]  # fmt: skip


def _bad(message: str) -> ApiError:
    return ApiError(400, "invalid_request", message)


def tool_calling(body: schemas.ChatCompletionCreate) -> ToolCalling:
    """Check ``body``'s ``tools``, ``tool_choice`` and tool messages and return what it asks
    (module docstring). Raises ApiError 400 naming the field for each fault the module
    docstring lists, and for ``response_format`` beside a required or named tool choice (one
    answer cannot be constrained to two schemas)."""
    calling = calling_from(body.tools, body.tool_choice, body.parallel_tool_calls)
    if calling.mode in ("required", "named") and body.response_format is not None and body.response_format.type != "text":
        raise _bad("response_format cannot be combined with a required or named tool_choice.")
    messages_check(body.messages)
    return calling


def calling_from(
    tools: list[schemas.ToolDefinition] | None,
    tool_choice: str | schemas.NamedToolChoice | None,
    parallel_tool_calls: bool = True,
) -> ToolCalling:
    """The function calling a request's ``tools``, ``tool_choice`` and ``parallel_tool_calls``
    ask for (``auto`` when tools are given and no choice, else ``none``). Raises ApiError 400
    naming the field: a ``parameters`` that is not a JSON Schema (or not an object's), two
    functions of one name, a named function not in ``tools``, ``required`` or a named function
    without tools."""
    functions: dict[str, dict] = {}
    for index, tool in enumerate(tools or []):
        function = tool.function
        if function.name in functions:
            raise _bad(f"tools[{index}].function.name: '{function.name}' is given twice; names must be unique.")
        if function.parameters is not None:
            _schema_check(function.parameters, f"tools[{index}].function.parameters")
        functions[function.name] = function.model_dump(exclude_none=True)
    if isinstance(tool_choice, schemas.NamedToolChoice):
        if tool_choice.function.name not in functions:
            known = ", ".join(functions) or "none"
            raise _bad(f"tool_choice: the function '{tool_choice.function.name}' is not in tools (given: {known}).")
        return ToolCalling("named", functions, named=tool_choice.function.name, parallel=parallel_tool_calls)
    mode = tool_choice or ("auto" if functions else "none")
    if mode == "required" and not functions:
        raise _bad("tool_choice: 'required' needs at least one function in tools.")
    return ToolCalling(mode, functions, parallel=parallel_tool_calls)


def json_schema_check(schema: dict, where: str) -> None:
    """Raise ApiError 400 naming ``where`` (the request field, e.g.
    ``response_format.json_schema.schema``) and the spot inside unless ``schema`` is a JSON
    Schema: valid against its own draft's meta-schema, Draft 2020-12 when it names none. The
    engine's structured output raises on one that is not, so it is checked before admission.
    Also 400 for one nested too deeply for the check to recurse through (Python's limit)."""
    try:
        validators.validator_for(schema, default=validators.Draft202012Validator).check_schema(schema)
    except schema_errors.SchemaError as exc:
        path = "".join(f"[{p!r}]" for p in exc.path)
        raise _bad(f"{where}{path} is not a valid JSON Schema: {exc.message}") from None
    except RecursionError:
        raise _bad(f"{where} is nested too deeply to check; flatten it (for example with $defs).") from None


def _schema_check(parameters: dict, where: str) -> None:
    """Raise ApiError 400 unless ``parameters`` is a JSON Schema (:func:`json_schema_check`)
    of an object."""
    json_schema_check(parameters, where)
    if parameters.get("type", "object") != "object":
        raise _bad(f"{where}: the arguments must be an object (\"type\": \"object\").")


def messages_check(messages: list[schemas.ChatMessage]) -> None:
    """Raise ApiError 400 naming the message when one carries what its role may not: content
    missing on a system/user/tool message or on an assistant message without calls,
    ``tool_calls`` off an assistant message, a ``tool`` message without ``tool_call_id`` or
    whose id matches no call of an earlier assistant message."""
    calls: set[str] = set()
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if message.tool_calls and message.role != "assistant":
            raise _bad(f"{where}: only assistant messages carry tool_calls.")
        if message.role == "assistant":
            if message.content is None and not message.tool_calls:
                raise _bad(f"{where}: an assistant message needs content or tool_calls.")
            calls.update(call.id for call in message.tool_calls or ())
            continue
        if message.content is None:
            raise _bad(f"{where}: a {message.role} message needs content.")
        if message.role == "tool":
            if not message.tool_call_id:
                raise _bad(f"{where}: a tool message needs the tool_call_id of the call it answers.")
            if message.tool_call_id not in calls:
                raise _bad(f"{where}: tool_call_id '{message.tool_call_id}' matches no tool call of an earlier assistant message.")


def prompt_messages(messages: list[schemas.ChatMessage]) -> list[dict[str, str]]:
    """``messages`` as ``[{role, content}]`` texts for the model's chat template, in the Hermes
    format (inference/tool_format.py ``hermes_messages``): calls as ``<tool_call>`` blocks after
    the assistant's text, consecutive tool results as one user message of ``<tool_response>``
    blocks, ``developer`` read as ``system``."""
    return hermes_messages(
        [
            {
                "role": m.role,
                "content": m.text(),
                "tool_calls": [c.model_dump() for c in m.tool_calls or ()],
                "tool_call_id": m.tool_call_id,
            }
            for m in messages
        ]
    )
