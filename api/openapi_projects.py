"""The ``/v1/projects`` part of the OpenAPI document (api/openapi.py ``build_document`` adds it;
kept apart so that module stays readable). Shapes from api/projects.py."""

from __future__ import annotations

from collections.abc import Callable

from api import schemas

REF = "#/components/schemas/{model}"
UUID_PARAM = {"type": "string", "format": "uuid"}
PROJECT_ID = {"name": "project_id", "in": "path", "required": True, "schema": UUID_PARAM}
# The request bodies, for models_json_schema.
BODIES = [(schemas.ProjectCreate, "validation"), (schemas.ProjectUpdate, "validation")]


def components() -> dict:
    """The response schemas: Project, ProjectWithFiles, ProjectList."""
    project = {
        "type": "object",
        "required": ["project_id", "name", "instructions", "region", "can_edit", "created_at", "updated_at"],
        "properties": {
            "project_id": UUID_PARAM,
            "name": {"type": "string"},
            "instructions": {"type": "string"},
            "region": {"type": "string"},
            "organisation_id": {"type": ["integer", "null"]},  # null: a personal project
            "owner_id": {"type": "integer"},
            "can_edit": {"type": "boolean"},  # whether the caller may change or delete it
            "created_at": {"type": "string", "format": "date-time"},
            "updated_at": {"type": "string", "format": "date-time"},
        },
    }
    file = {
        "type": "object",
        "properties": {
            "file_id": UUID_PARAM,
            "name": {"type": "string"},
            "kind": {"enum": ["text", "markdown", "pdf", "docx"]},
            "size": {"type": "integer"},
            "status": {"enum": ["pending", "ready", "failed"]},
            "error": {"type": "string"},
        },
    }
    return {
        "Project": project,
        "ProjectWithFiles": {
            "allOf": [
                {"$ref": REF.format(model="Project")},
                {"type": "object", "properties": {"files": {"type": "array", "items": file}}},
            ]
        },
        "ProjectList": {
            "type": "object",
            "required": ["projects"],
            "properties": {"projects": {"type": "array", "items": {"$ref": REF.format(model="Project")}}},
        },
    }


def paths(*, error: Callable, json: Callable, body: Callable, common: dict, body_errors: dict) -> dict:
    """The two paths, with api/openapi.py's helpers (``error``, ``json``, ``body``) and its
    common and body error responses."""
    not_found = error("No such project (or not one you may open).")
    forbidden = error("A workspace member who may open the project but not change it.")
    return {
        "/v1/projects": {
            "get": {
                "operationId": "listProjects",
                "responses": {"200": json(REF.format(model="ProjectList")), **common},
            },
            "post": {
                "operationId": "createProject",
                "requestBody": body("ProjectCreate"),
                "responses": {"201": json(REF.format(model="Project"), "Created"), **body_errors, **common},
            },
        },
        "/v1/projects/{project_id}": {
            "parameters": [PROJECT_ID],
            "get": {
                "operationId": "getProject",
                "responses": {"200": json(REF.format(model="ProjectWithFiles")), "404": not_found, **common},
            },
            "patch": {
                "operationId": "updateProject",
                "requestBody": body("ProjectUpdate"),
                "responses": {
                    "200": json(REF.format(model="Project")), **body_errors, "403": forbidden,
                    "404": not_found, **common,
                },  # fmt: skip
            },
            "delete": {
                "operationId": "deleteProject",
                "responses": {
                    "204": {"description": "Deleted with its files and every chat in it."},
                    "403": forbidden, "404": not_found, **common,
                },  # fmt: skip
            },
        },
    }
