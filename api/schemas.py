"""Request bodies of ``/v1``, validated with pydantic (unknown fields are refused)."""

from __future__ import annotations

from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, RootModel, model_validator

from core.schemas import Strict, Text


class ConversationCreate(Strict):
    model: Text | None = Field(default=None, max_length=200)
    system_prompt: Text | None = Field(default=None, max_length=8000)
    # Start it in this project (GET /v1/projects): its instructions and files apply (issue 30).
    project_id: UUID | None = None


class ProjectCreate(Strict):
    name: Text = Field(min_length=1, max_length=120)
    instructions: Text = Field(default="", max_length=8000)


class ProjectUpdate(Strict):
    """A partial update: the fields given are changed, the others kept."""

    name: Text | None = Field(default=None, min_length=1, max_length=120)
    instructions: Text | None = Field(default=None, max_length=8000)


class TurnRegenerate(Strict):
    model: Text | None = Field(default=None, max_length=200)
    max_tokens: int | None = Field(default=None, ge=1)


class TextPart(Strict):
    """One part of a message's content given as a list (OpenAI's content parts; text only)."""

    type: Literal["text"]
    text: Text


class ToolCallFunction(BaseModel):
    name: str = Field(min_length=1, max_length=64)
    # The arguments as the model wrote them: a JSON text (OpenAI's shape), not an object.
    arguments: str


class ToolCall(BaseModel):
    """A call an assistant message made (OpenAI's ``tool_calls`` items)."""

    id: str = Field(min_length=1, max_length=200)
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(BaseModel):
    """One message of a chat completion request. ``content``: text, a list of text parts, or
    null on an assistant message that only calls tools; ``tool_calls`` on assistant messages;
    ``tool_call_id`` on ``tool`` messages (the result of that call). ``developer`` is OpenAI's
    newer name for ``system``. Further fields OpenAI clients send (``refusal``, ``audio``) are
    ignored. Which role may carry what is checked in api/tools.py ``messages_check``."""

    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    # OpenAI refuses an empty list of parts ("empty array"), so does this.
    content: Text | Annotated[list[TextPart], Field(min_length=1)] | None = None
    name: str | None = Field(default=None, max_length=64)
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = Field(default=None, max_length=200)

    @model_validator(mode="before")
    @classmethod
    def _text_parts_only(cls, data: Any) -> Any:
        """Refuse a content part that is not text (OpenAI's ``image_url``, ``input_audio``,
        ``file``) with one error saying so, before the content union's per-branch errors.
        Raises ValueError (a 400 through core/http.py ``parse_json``)."""
        content = data.get("content") if isinstance(data, dict) else None
        for index, part in enumerate(content if isinstance(content, list) else ()):
            kind = part.get("type") if isinstance(part, dict) else None
            if isinstance(kind, str) and kind != "text":
                raise ValueError(
                    f"content[{index}] is a '{kind}' part; this model reads text only: send the "
                    'content as a string or as {"type": "text", "text": ...} parts'
                )
        return data

    def text(self) -> str:
        """The content as one text ("" for none; text parts joined with newlines)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text for part in self.content)


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = Field(default=None, max_length=4000)
    # A JSON Schema of the arguments object (checked in api/tools.py); None: no arguments.
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDefinition(BaseModel):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(BaseModel):
    name: str = Field(min_length=1, max_length=64)


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: NamedFunction


class TurnCreate(Strict):
    role: Literal["user"]
    content: Text = Field(min_length=1)
    # The pool to answer with (GET /v1/models); None: the conversation's, else the tier's.
    model: Text | None = Field(default=None, max_length=200)
    max_tokens: int | None = Field(default=None, ge=1)
    # Edit: the id of the user turn this message replaces (append-only; the old one is kept).
    replaces: UUID | None = None
    # Files uploaded with POST /v1/conversations/{id}/attachments to send with this message
    # (their text joins its prompt; attachments/). At most CHAT_ATTACHMENT_MAX_FILES.
    attachments: list[UUID] = Field(default_factory=list, max_length=32)
    # Function calling for this answer (api/tools.py, as on /v1/chat/completions).
    tools: list[ToolDefinition] | None = Field(default=None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True


class ToolResult(Strict):
    """The result of one call the latest answer made (its ``tool_calls[].id``)."""

    tool_call_id: Text = Field(min_length=1, max_length=200)
    content: Text


class ToolResultsCreate(Strict):
    """``POST /v1/conversations/{id}/turns`` with ``role: "tool"``: the results of the latest
    answer's calls, each stored as a ``tool`` turn; once every call has one, the next answer is
    written. Tools are per request (as with the Responses API's ``previous_response_id``): send
    them again for the next answer to see (and call) them."""

    role: Literal["tool"]
    results: list[ToolResult] = Field(min_length=1, max_length=128)
    model: Text | None = Field(default=None, max_length=200)
    max_tokens: int | None = Field(default=None, ge=1)
    tools: list[ToolDefinition] | None = Field(default=None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True


class TurnOrResults(RootModel):
    """The body of ``POST /v1/conversations/{id}/turns``: a user message or tool results,
    told apart by ``role``."""

    root: Annotated[TurnCreate | ToolResultsCreate, Field(discriminator="role")]


class JsonSchemaFormat(Strict):
    name: str = Field(default="response", max_length=64)
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None
    description: str | None = None


class ResponseFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StreamOptions(Strict):
    include_usage: bool = False


class ForwardedAdmission(Strict):
    """Where a gateway's turn belongs in its engine process's admission queue (DESIGN.md,
    "Production topology"): the user's ``tier`` (paid and enterprise may take the reserved
    slots) and the engine ``priority`` the gateway routed it at (vLLM's convention: lower runs
    first). Only the service credential may send it (api/completions.py)."""

    tier: Literal["free", "paid", "enterprise", "background"]
    priority: int = Field(ge=0, le=1_000_000)


# vLLM's limits for ``cache_salt`` (vllm/entrypoints/generate/base/protocol.py): 1..128
# characters, none of ``@ / \`` or NUL.
CacheSalt = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[^@/\\\x00]+$")]


# A sampling seed fits a signed 64-bit integer, as vLLM's own OpenAI server bounds it
# (vllm/entrypoints/openai/chat_completion/protocol.py): the engine's generator takes no more.
Seed = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
# Sampling numbers are finite: NaN passes every bound check, and JSON parsers here accept it.
Temperature = Annotated[float, Field(ge=0, le=2, allow_inf_nan=False)]
TopP = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]


class ChatCompletionCreate(BaseModel):
    """OpenAI's chat completion request (the subset served). Unknown OpenAI fields that change
    nothing here (``user``, ``n`` = 1, ...) are accepted and ignored, as OpenAI clients send them."""

    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1)
    messages: list[ChatMessage] = Field(min_length=1)
    # Null means the default for ``stream`` and ``n``, as in OpenAI's API (both are nullable).
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: Temperature | None = None
    top_p: TopP | None = None
    stop: str | list[str] | None = None
    seed: Seed | None = None
    n: Literal[1] | None = 1
    response_format: ResponseFormat | None = None
    # Function calling (api/tools.py): the functions the model may call, whether and which it
    # must call, and whether it may call several at once.
    tools: list[ToolDefinition] | None = Field(default=None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    # Service credential only: a gateway's turn (ForwardedAdmission).
    admission: ForwardedAdmission | None = None
    # Service credential only: the tenant's prefix-cache salt its gateway derived
    # (gateway/tenancy.py); vLLM's field of the same name and limits.
    cache_salt: CacheSalt | None = None


class EmbeddingCreate(BaseModel):
    """OpenAI's embeddings request. ``input``: a text or a list of texts (token-id input is
    refused by the view: this model's vocabulary is not OpenAI's); ``encoding_format``:
    ``float`` (lists of numbers) or ``base64`` (little-endian float32 bytes, what the official
    SDK asks for by default); ``dimensions``: only the model's own. Unknown OpenAI fields
    (``user``) are accepted and ignored."""

    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1)
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)


class CompletionCreate(BaseModel):
    """OpenAI's (legacy) completion request, as vLLM serves it: ``prompt`` may be text or token
    ids. Gateways without an engine of their own send token ids here (inference/remote.py)."""

    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1)
    prompt: Text | list[Annotated[int, Field(ge=0)]] = Field(min_length=1)
    # Null means the default for ``stream`` and ``n``, as in OpenAI's API (both are nullable).
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: Temperature | None = None
    top_p: TopP | None = None
    stop: str | list[str] | None = None
    seed: Seed | None = None
    n: Literal[1] | None = 1
    # Service credential only: a gateway's turn (ForwardedAdmission).
    admission: ForwardedAdmission | None = None
    # Service credential only: the tenant's prefix-cache salt its gateway derived
    # (gateway/tenancy.py); vLLM's field of the same name and limits.
    cache_salt: CacheSalt | None = None
