"""The ``components/schemas`` of the OpenAPI document of ``/v1`` (api/openapi.py
``build_document`` uses them; the ``/v1/projects`` ones are in api/openapi_projects.py).

Request bodies are generated from the same pydantic models the views validate with
(api/schemas.py, memory/api.py, feedback/api.py), so they cannot drift from what is accepted;
the response shapes are written out here.
"""

from __future__ import annotations

from pydantic.json_schema import models_json_schema

from api import openapi_projects, schemas
from feedback.api import FeedbackCreate
from memory.api import MemoryPatch

REF = "#/components/schemas/{model}"
UUID_PARAM = {"type": "string", "format": "uuid"}


def components() -> dict:
    """The schemas of every request body (validation mode) and response of ``/v1`` outside
    ``/v1/projects``, by name."""
    _, defs = models_json_schema(
        [
            (schemas.ConversationCreate, "validation"),
            (schemas.TurnCreate, "validation"),
            (schemas.ToolResultsCreate, "validation"),
            (schemas.TurnRegenerate, "validation"),
            (schemas.ChatCompletionCreate, "validation"),
            (schemas.CompletionCreate, "validation"),
            (schemas.EmbeddingCreate, "validation"),
            (MemoryPatch, "validation"),
            (FeedbackCreate, "validation"),
            *openapi_projects.BODIES,
        ],
        ref_template=REF,
    )
    components = dict(defs.get("$defs", {}))
    components["Error"] = {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["type", "message"],
                "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
            }
        },
    }
    components["ConversationCreated"] = {
        "type": "object",
        "required": ["conversation_id", "region"],
        "properties": {
            "conversation_id": UUID_PARAM,
            "region": {"type": "string"},
            "project_id": {"anyOf": [UUID_PARAM, {"type": "null"}]},  # the project it started in
        },
    }
    components["Turn"] = {
        "type": "object",
        "required": ["turn_id", "role", "content", "status", "created_at"],
        "properties": {
            "turn_id": UUID_PARAM,
            "role": {"enum": ["user", "assistant", "system", "tool"]},
            "content": {"type": "string"},
            "status": {"enum": ["complete", "cancelled", "failed"]},
            "token_count": {"type": "integer"},
            "reply_to": {"anyOf": [UUID_PARAM, {"type": "null"}]},
            # The turn this one edits (user) or regenerates (assistant); null for an original.
            "replaces": {"anyOf": [UUID_PARAM, {"type": "null"}]},
            # User turns: the message before it on its branch (the turn tree); null for a first
            # message and for one written before branches existed.
            "parent": {"anyOf": [UUID_PARAM, {"type": "null"}]},
            # Assistant turns: earlier exchanges its prompt left out or took from the summary.
            "context_trimmed": {"type": "integer", "minimum": 0},
            # Assistant turns: the pool and model version that answered, prefix-cache hits
            # (tokens) and the cost in USD (a decimal string); "" / null on user turns.
            "pool": {"type": "string"},
            "model_version": {"type": "string"},
            "cached_tokens": {"type": ["integer", "null"], "minimum": 0},
            "cost_usd": {"type": ["string", "null"]},
            "moderation_verdict": {"type": "object"},
            "created_at": {"type": "string", "format": "date-time"},
            # User turns: the files sent with it (attachments/); [] for the others.
            "attachments": {"type": "array", "items": {"$ref": REF.format(model="Attachment")}},
        },
    }
    components["Attachment"] = {
        "type": "object",
        "required": ["attachment_id", "name", "content_type", "size", "tokens", "total_tokens", "truncated"],
        "properties": {
            "attachment_id": UUID_PARAM,
            "name": {"type": "string"},
            "content_type": {"enum": ["text/plain", "application/pdf"]},
            "size": {"type": "integer", "minimum": 1},
            # Tokens of its text that go into the prompt; the whole text's; whether it was cut.
            "tokens": {"type": "integer", "minimum": 0},
            "total_tokens": {"type": "integer", "minimum": 0},
            "total_tokens_estimated": {"type": "boolean"},
            "truncated": {"type": "boolean"},
        },
    }
    components["AttachmentUpload"] = {
        "type": "object",
        "required": ["file"],
        "properties": {"file": {"type": "string", "format": "binary"}},
    }
    components["ProjectFile"] = {  # projects/api.py file_json
        "type": "object",
        "required": ["file_id", "name", "kind", "size", "status", "error", "pages", "chars", "passages", "created_at", "ready_at"],
        "properties": {
            "file_id": UUID_PARAM, "name": {"type": "string"},
            "kind": {"enum": ["text", "markdown", "pdf", "docx"]}, "size": {"type": "integer", "minimum": 1},
            # pending: the worker has not read it yet; failed: `error` says why, for a person.
            "status": {"enum": ["pending", "ready", "failed"]}, "error": {"type": "string"},
            "pages": {"type": ["integer", "null"]}, "chars": {"type": "integer", "minimum": 0},
            "passages": {"type": "integer", "minimum": 0},
            "created_at": {"type": "string", "format": "date-time"},
            "ready_at": {"type": ["string", "null"], "format": "date-time"},
        },
    }  # fmt: skip
    conversation_props = {
        "conversation_id": UUID_PARAM,
        "title": {"type": "string"},
        "model": {"type": "string"},
        "region": {"type": "string"},
        "project_id": {"anyOf": [UUID_PARAM, {"type": "null"}]},
        "created_at": {"type": "string", "format": "date-time"},
        "last_turn_at": {"type": "string", "format": "date-time"},
    }
    components["Conversation"] = {"type": "object", "properties": conversation_props}
    components["ConversationList"] = {
        "type": "object",
        "required": ["conversations", "next_cursor"],
        "properties": {
            "conversations": {"type": "array", "items": {"$ref": REF.format(model="Conversation")}},
            "next_cursor": {"type": ["string", "null"]},
        },
    }
    components["ConversationHistory"] = {
        "type": "object",
        "required": ["conversation_id", "turns", "next_cursor"],
        "properties": {
            **conversation_props,
            "path": {"enum": ["all", "selected"]},
            "turns": {"type": "array", "items": {"$ref": REF.format(model="Turn")}},
            "next_cursor": {"type": ["string", "null"]},
        },
    }
    components["ChatCompletion"] = {"type": "object", "required": ["id", "object", "choices"]}
    components["ModelList"] = {"type": "object", "required": ["object", "data"]}
    components["EmbeddingList"] = {
        "type": "object",
        "required": ["object", "data", "model", "usage"],
        "properties": {
            "object": {"const": "list"},
            "data": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["object", "index", "embedding"],
                    "properties": {
                        "object": {"const": "embedding"},
                        "index": {"type": "integer"},
                        # floats, or base64 of little-endian float32 (encoding_format)
                        "embedding": {"anyOf": [{"type": "array", "items": {"type": "number"}}, {"type": "string"}]},
                    },
                },
            },
            "model": {"type": "string"},
            "usage": {"type": "object", "required": ["prompt_tokens", "total_tokens"]},
        },
    }
    components["UserMemory"] = {
        "type": "object",
        "required": ["memory_enabled", "facts"],
        "properties": {
            "memory_enabled": {"type": "boolean"},
            "facts": {"type": "array", "items": {"type": "object", "required": ["fact_id", "text"]}},
        },
    }

    components["Feedback"] = {
        "type": "object",
        "required": ["feedback_id", "conversation_id", "turn_id", "rating", "comment"],
        "properties": {
            "feedback_id": UUID_PARAM, "conversation_id": UUID_PARAM, "turn_id": UUID_PARAM,
            "rating": {"enum": ["up", "down"]}, "comment": {"type": "string"},
            "pool": {"type": "string"}, "model_version": {"type": "string"},
            "created_at": {"type": "string", "format": "date-time"},
            "updated_at": {"type": "string", "format": "date-time"},
        },
    }  # fmt: skip
    return components
