"""The OpenAPI 3.1 document of ``/v1``, served at ``/v1/openapi.json``.

Request bodies come from the same pydantic models the views validate with, so the document
cannot drift from what is accepted. The paths are here; the schemas in api/openapi_schemas.py,
and the ``/v1/projects`` part in api/openapi_projects.py. ``tests/integration/test_openapi.py``
checks that every ``/v1`` route is in it, and runs schemathesis against it.
"""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

from api import openapi_projects, openapi_schemas
from api.openapi_schemas import REF, UUID_PARAM


def _error(description: str) -> dict:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }


def _json(ref: str, description: str = "OK") -> dict:
    return {"description": description, "content": {"application/json": {"schema": {"$ref": ref}}}}


SSE = {
    "description": "Server-Sent Events: `token` {text}, then `done` {turn_id, status, usage, html} "
    "or `error` {message}; every event has an `id:`; `: keep-alive` comments in between.",
    "content": {"text/event-stream": {"schema": {"type": "string"}}},
}
COMMON = {"401": _error("Missing, invalid or revoked API key.")}
BODY_ERRORS = {
    "400": _error("Malformed JSON or a body that does not match the schema."),
    "413": _error("The body is too large."),
    "415": _error("The body is not application/json."),
}
# A model that does not exist (404) or that the caller's tier may not use (403): gateway/gate.py.
MODEL_ERRORS = {
    "403": _error("The model is not available on your tier (the message lists yours)."),
    "404": _error("Unknown model (the message lists the models)."),
}
# Refusals before any engine work (gateway/gate.py): every 429 and 503 carries Retry-After.
ADMISSION_ERRORS = {
    "403": MODEL_ERRORS["403"],
    "429": _error("Over your (or your organisation's) requests- or tokens-per-minute limit; "
                  "Retry-After says when enough has refilled."),
    "503": _error("Busy (free-tier traffic is shed under load) or the model is unavailable; "
                  "see Retry-After."),
}  # fmt: skip
PAGING = [
    {"name": "before", "in": "query", "required": False, "schema": {"type": "string"},
     "description": "A `next_cursor` from the previous page (opaque, signed)."},
    {"name": "limit", "in": "query", "required": False,
     "schema": {"type": "integer", "minimum": 1, "maximum": 100}},
]  # fmt: skip
PROJECT_ID = {"name": "project_id", "in": "path", "required": True, "schema": UUID_PARAM}
CONVERSATION_ID = {"name": "conversation_id", "in": "path", "required": True, "schema": UUID_PARAM}
SEARCH = {
    "name": "q", "in": "query", "required": False,
    "schema": {"type": "string", "maxLength": 200},
    "description": "Full-text search over your conversations' titles and turn text (web-search "
                   "syntax: words, \"quoted phrases\", or, -word; English stemming). The matches "
                   "come most recently active first, in one page: `next_cursor` is null.",
}  # fmt: skip

TREE_PATH = {
    "name": "path", "in": "query", "required": False,
    "schema": {"enum": ["all", "selected"], "default": "all"},
    "description": "`all`: the whole turn log, every branch and version, paged. `selected`: only "
                   "the branch the chat page shows (each message with the answer shown, oldest "
                   "first), in one page: `next_cursor` is null and `before` / `limit` are refused.",
}  # fmt: skip


def _body(model: str) -> dict:
    return {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": REF.format(model=model)}}},
    }


def build_document() -> dict:
    """The whole OpenAPI document as a dict."""
    components = openapi_schemas.components()
    paths = {
        "/v1/conversations": {
            "get": {
                "operationId": "listConversations",
                "parameters": [*PAGING, SEARCH],
                "responses": {
                    "200": _json(REF.format(model="ConversationList")),
                    "400": _error("Bad `before`, `limit` or `q` (or `before` with `q`)."),
                    **COMMON,
                },
            },
            "post": {
                "operationId": "createConversation",
                "requestBody": _body("ConversationCreate"),
                "responses": {
                    "201": _json(REF.format(model="ConversationCreated"), "Created"),
                    **BODY_ERRORS,
                    **MODEL_ERRORS,
                    **COMMON,
                },
            },
        },
        "/v1/conversations/{conversation_id}": {
            "parameters": [CONVERSATION_ID],
            "get": {
                "operationId": "getConversation",
                "parameters": [*PAGING, TREE_PATH],
                "responses": {
                    "200": _json(REF.format(model="ConversationHistory")),
                    "400": _error("Bad `before`, `limit` or `path` (or `before` / `limit` with `path=selected`)."),
                    "404": _error("No such conversation (or not yours)."),
                    **COMMON,
                },
            },
            "delete": {
                "operationId": "deleteConversation",
                "responses": {
                    "204": {"description": "Deleted with all its turns."},
                    "404": _error("No such conversation (or not yours)."),
                    **COMMON,
                },
            },
        },
        "/v1/conversations/{conversation_id}/turns": {
            "parameters": [CONVERSATION_ID],
            "post": {
                "operationId": "createTurn",
                "parameters": [
                    {"name": "Idempotency-Key", "in": "header", "required": False,
                     "schema": {"type": "string", "minLength": 1, "maxLength": 255},
                     "description": "Retrying with the same key returns the same turn's stream "
                                    "(kept 24 h)."},
                ],  # fmt: skip
                "description": "A user message (`role: \"user\"`, TurnCreate) or the results of the "
                               "latest answer's tool calls (`role: \"tool\"`, ToolResultsCreate). With "
                               "`tools` (as on /v1/chat/completions) an answer that calls functions "
                               "streams a `tool_call` event per call and ends `done` with "
                               "`finish_reason: \"tool_calls\"` and `tool_calls`; it is stored as an "
                               "assistant turn with those calls. Send every call's result as "
                               "`{\"role\": \"tool\", \"results\": [{\"tool_call_id\", \"content\"}], "
                               "\"tools\": [...]}` (tools are per request: send them again): each is "
                               "stored as a `tool` turn, and once all calls have one the next answer "
                               "streams (200); results for only some calls get 202 "
                               "`{\"tool_turns\", \"awaiting\"}`.",
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": {"oneOf": [
                        {"$ref": REF.format(model="TurnCreate")}, {"$ref": REF.format(model="ToolResultsCreate")},
                    ], "discriminator": {"propertyName": "role"}}}},
                },
                "responses": {
                    "200": SSE,
                    "202": {"description": "Tool results stored; other calls still await theirs (no answer yet).",
                            "content": {"application/json": {"schema": {"type": "object", "properties": {
                                "tool_turns": {"type": "array", "items": {"type": "string", "format": "uuid"}},
                                "awaiting": {"type": "array", "items": {"type": "string"}},
                            }}}}},
                    **BODY_ERRORS,
                    "422": _error("The Idempotency-Key was used for a different request."),
                    **ADMISSION_ERRORS,
                    "404": _error("No such conversation (or not yours), an unknown model, or an "
                                  "attachment that is not this conversation's."),
                    "409": _error("An answer is still being written in this conversation."),
                    **COMMON,
                },
            },
        },
        "/v1/conversations/{conversation_id}/attachments": {
            "parameters": [CONVERSATION_ID],
            "post": {
                "operationId": "uploadAttachment",
                "description": "Upload one file (plain text in UTF-8, Markdown, source code, or a PDF, "
                               "judged by its content) to send with a later turn "
                               "(`attachments` in the turn's body).",
                "requestBody": {
                    "required": True,
                    "content": {"multipart/form-data": {"schema": {"$ref": REF.format(model="AttachmentUpload")}}},
                },
                "responses": {
                    "201": _json(REF.format(model="Attachment"), "Stored; not sent with a message yet."),
                    "400": _error("No file, several files, a malformed body, an empty file or one with "
                                  "no text, or a damaged or password-protected PDF."),
                    "403": _error("The conversation's organisation keeps no data: no files."),
                    "404": _error("No such conversation (or not yours)."),
                    "409": _error("The conversation holds as many files as it may."),
                    "413": _error("The file (or a PDF's page count) is over the limit."),
                    "415": _error("Not multipart/form-data, or the file is not UTF-8 text or a PDF."),
                    **COMMON,
                },
            },
        },
        "/v1/conversations/{conversation_id}/turns/{turn_id}/events": {
            "parameters": [
                CONVERSATION_ID,
                {"name": "turn_id", "in": "path", "required": True, "schema": UUID_PARAM},
                {"name": "Last-Event-ID", "in": "header", "required": False,
                 "schema": {"type": "string"}},
            ],  # fmt: skip
            "get": {
                "operationId": "resumeTurnEvents",
                "responses": {
                    "200": SSE,
                    "404": _error("No such assistant turn in this conversation."),
                    **COMMON,
                },
            },
        },
        "/v1/conversations/{conversation_id}/turns/{turn_id}/regenerate": {
            "parameters": [
                CONVERSATION_ID,
                {"name": "turn_id", "in": "path", "required": True, "schema": UUID_PARAM},
            ],
            "post": {
                "operationId": "regenerateTurn",
                "requestBody": {
                    "required": False,
                    "content": {"application/json": {"schema": {"$ref": REF.format(model="TurnRegenerate")}}},
                },
                "responses": {
                    "200": SSE,
                    **BODY_ERRORS,
                    **ADMISSION_ERRORS,
                    "404": _error("No such assistant turn in this conversation (or not yours), or an unknown model."),
                    "409": _error("An answer is still being written in this conversation."),
                    **COMMON,
                },
            },
        },
        "/v1/conversations/{conversation_id}/turns/{turn_id}/feedback": {
            "parameters": [
                CONVERSATION_ID,
                {"name": "turn_id", "in": "path", "required": True, "schema": UUID_PARAM},
            ],
            "post": {
                "operationId": "rateAnswer",
                "requestBody": _body("FeedbackCreate"),
                "responses": {
                    "200": _json(REF.format(model="Feedback"), "Stored (replacing your earlier rating)."),
                    **BODY_ERRORS,
                    "400": _error("A body that does not match, a comment over the limit, or a "
                                  "turn that is your message rather than an answer."),
                    "404": _error("No such conversation (or not yours), or no such turn in it."),
                    **COMMON,
                },
            },
        },
        "/v1/conversations/{conversation_id}/cancel": {
            "parameters": [CONVERSATION_ID],
            "post": {
                "operationId": "cancelTurn",
                "responses": {
                    "204": {"description": "Aborted (or nothing was generating)."},
                    "404": _error("No such conversation (or not yours)."),
                    **COMMON,
                },
            },
        },
        "/v1/chat/completions": {
            "post": {
                "operationId": "createChatCompletion",
                "requestBody": _body("ChatCompletionCreate"),
                "responses": {
                    "200": {
                        "description": "A chat completion, or chunks as SSE when `stream` is true.",
                        "content": {
                            "application/json": {"schema": {"$ref": REF.format(model="ChatCompletion")}},
                            "text/event-stream": {"schema": {"type": "string"}},
                        },
                    },
                    **BODY_ERRORS,
                    **ADMISSION_ERRORS,
                    "404": _error("Unknown model."),
                    **COMMON,
                },
            },
        },
        "/v1/completions": {
            "post": {
                "operationId": "createCompletion",
                "requestBody": _body("CompletionCreate"),
                "responses": {
                    "200": {
                        "description": "A text completion, or chunks as SSE when `stream` is true.",
                        "content": {
                            "application/json": {"schema": {"$ref": REF.format(model="ChatCompletion")}},
                            "text/event-stream": {"schema": {"type": "string"}},
                        },
                    },
                    **BODY_ERRORS,
                    **ADMISSION_ERRORS,
                    "404": _error("Unknown model."),
                    **COMMON,
                },
            },
        },
        "/v1/users/{user_id}/memory": {
            "parameters": [{"name": "user_id", "in": "path", "required": True, "schema": {"type": "integer"}}],
            "get": {
                "operationId": "getUserMemory",
                "responses": {
                    "200": _json(REF.format(model="UserMemory")),
                    "404": _error("No such user (or not you)."),
                    **COMMON,
                },
            },
            "patch": {
                "operationId": "patchUserMemory",
                "requestBody": _body("MemoryPatch"),
                "responses": {
                    "200": _json(REF.format(model="UserMemory")),
                    **BODY_ERRORS,
                    "404": _error("No such user (or not you)."),
                    **COMMON,
                },
            },
        },
        "/v1/users/{user_id}/export": {
            "parameters": [{"name": "user_id", "in": "path", "required": True, "schema": {"type": "integer"}}],
            "get": {
                "operationId": "exportUserData",
                "description": "Your data as a .zip: data.json, one Markdown file per conversation, the attachments (privacy/export.py).",
                "responses": {
                    "200": {"description": "The archive.", "content": {"application/zip": {"schema": {"type": "string", "format": "binary"}}}},
                    "404": _error("No such user (or not you)."),
                    **COMMON,
                },
            },
        },
        "/v1/embeddings": {
            "post": {
                "operationId": "createEmbeddings",
                "description": "Embeddings from the model memory uses (api/embeddings.py): 384 floats per text, L2-normalised.",
                "requestBody": _body("EmbeddingCreate"),
                "responses": {
                    "200": _json(REF.format(model="EmbeddingList")),
                    **BODY_ERRORS,
                    "404": _error("Unknown model."),
                    "429": _error("Rate limited (RPM or TPM)."),
                    **COMMON,
                },
            }
        },
        "/v1/imports": {
            "post": {
                "operationId": "importChats",
                "description": "Import a chat export (ChatGPT conversations.json, an Open WebUI chat export, or this service's JSON) as your conversations (imports/views.py). The file goes in the multipart field 'file'; the same file twice adds nothing.",
                "requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
                    "type": "object", "required": ["file"],
                    "properties": {"file": {"type": "string", "format": "binary"}}}}}},
                "responses": {
                    "201": {"description": "What was imported.", "content": {"application/json": {"schema": {
                        "type": "object", "required": ["created", "already", "messages", "blocked", "skipped"]}}}},
                    "400": _error("Not a chat export this service reads, or malformed (the message names the part); nothing imported."),
                    "413": _error("The file is over the size limit."),
                    "415": _error("The body is not multipart/form-data."),
                    **COMMON,
                },
            }  # fmt: skip
        },
        "/v1/projects/{project_id}/files": {
            "parameters": [PROJECT_ID],
            "get": {
                "operationId": "listProjectFiles",
                "responses": {
                    "200": {"description": "The project's files, oldest first.", "content": {"application/json": {"schema": {
                        "type": "object", "required": ["files"],
                        "properties": {"files": {"type": "array", "items": {"$ref": REF.format(model="ProjectFile")}}}}}}},
                    "404": _error("No such project (or not yours)."),
                    **COMMON,
                },
            },
            "post": {
                "operationId": "addProjectFile",
                "description": "Add one file (UTF-8 text, Markdown, PDF or DOCX, judged by its content) in the multipart field 'file'. A worker reads it afterwards: poll the list until its status is ready or failed (projects/api.py).",
                "requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {"$ref": REF.format(model="AttachmentUpload")}}}},
                "responses": {
                    "201": _json(REF.format(model="ProjectFile"), "Stored; status pending."),
                    "400": _error("No file, several files, a malformed body or an empty file."),
                    "404": _error("No such project (or not yours)."),
                    "413": _error("The file is over the size limit."),
                    "415": _error("Not multipart/form-data, or the file is not text, Markdown, a PDF or a DOCX."),
                    "503": _error("The project's region database is unavailable; see Retry-After."),
                    **COMMON,
                },
            },
        },
        "/v1/projects/{project_id}/files/{file_id}": {
            "parameters": [PROJECT_ID, {"name": "file_id", "in": "path", "required": True, "schema": UUID_PARAM}],
            "delete": {
                "operationId": "deleteProjectFile",
                "responses": {
                    "204": {"description": "Deleted: the file, its passages and its bytes."},
                    "404": _error("No such project or file (or not yours)."),
                    "503": _error("The project's region database is unavailable; see Retry-After."),
                    **COMMON,
                },
            },
        },  # fmt: skip
        "/v1/models": {
            "get": {
                "operationId": "listModels",
                "responses": {"200": _json(REF.format(model="ModelList")), **COMMON},
            }
        },
        "/v1/openapi.json": {
            "get": {
                "operationId": "getOpenApiDocument",
                "security": [],
                "responses": {"200": {"description": "This document.",
                                      "content": {"application/json": {"schema": {"type": "object"}}}}},
            }  # fmt: skip
        },
    }
    components.update(openapi_projects.components())
    paths.update(
        openapi_projects.paths(error=_error, json=_json, body=_body, common=COMMON, body_errors=BODY_ERRORS)
    )
    for item in paths.values():
        for method, operation in item.items():
            if method != "parameters":
                operation["responses"].setdefault("405", _error("Method not allowed."))
    return {
        "openapi": "3.1.0",
        "info": {"title": "chatsite API", "version": "1"},
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}],
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "paths": paths,
    }


@require_GET
def openapi_document(request: HttpRequest) -> JsonResponse:
    """``GET /v1/openapi.json``: the document (public, no key needed)."""
    return JsonResponse(build_document())
