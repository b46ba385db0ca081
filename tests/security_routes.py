"""The security table (issue 10): every URL of the site, how to fill its parameters with alice's
objects (tests/security_world.py), the methods it accepts, the body that would do harm if the
check were missing, and what each kind of caller must get (tests/security_outcomes.py).

``tests/test_security_matrix.py`` walks the URL resolver (tests/security_resolver.py) and fails
for a route this table does not cover, so a new endpoint cannot ship without saying who may use
it. Routes under ``admin/`` are covered by one rule (:data:`ADMIN`: Django's admin lets in
active staff only); every other route has a row here. Public routes (:data:`PUBLIC`) carry the
reason they are public.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from django.urls import reverse
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode

from tests.conftest import PASSWORD
from tests.security_outcomes import (
    API_ORG_MEMBERS,
    API_ORG_ROLE,
    API_OWN,
    API_PUBLIC,
    API_SELF,
    ORG_ADMINS_HIDDEN,
    ORG_MEMBERS,
    ORG_ROLE,
    OWN,
    PUBLIC,
    REVOKED_LINK,
    SELF,
    WITHDRAWN_INVITATION,
    WORKSPACE_READ,
    Body,
    Outcome,
    form,
    js,
)
from tests.security_world import World

# --- the rows ---------------------------------------------------------------------------------


def no_params(w: World) -> dict:
    return {}


@dataclass(frozen=True)
class Route:
    """One URL. ``kwargs``: its parameters from the world; ``query``: a query string;
    ``bodies``: per method, the body a harmful request would send; ``why``: for public and
    allowed-by-design rows, the reason; ``generates``: a request that is let through starts an
    answer (tests that let it through use the engine double)."""

    name: str
    methods: tuple[str, ...]
    access: dict[str, Outcome]
    kwargs: Callable[[World], dict] = no_params
    query: str = ""
    bodies: dict[str, Callable[[World], Body]] = field(default_factory=dict)
    why: str = ""
    generates: bool = False
    # Secrets a refused response may show by design (e.g. an invitation names its organisation).
    reveals: tuple[str, ...] = ()

    @property
    def api(self) -> bool:
        return self.name.startswith("v1-")

    def path(self, world: World) -> str:
        path = reverse(self.name, kwargs=self.kwargs(world))
        return f"{path}?{self.query}" if self.query else path

    def body(self, world: World, method: str) -> Body | None:
        make = self.bodies.get(method)
        return make(world) if make is not None else None


def conv(w: World) -> dict:
    return {"conversation_id": w.conversation.pk}


def question(w: World) -> dict:
    return {**conv(w), "turn_id": w.question.pk}


def answer(w: World) -> dict:
    return {**conv(w), "turn_id": w.answer.pk}


def project(w: World) -> dict:
    return {"project_id": w.project.pk}


def personal_project(w: World) -> dict:
    return {"project_id": w.personal_project.pk}


def acme(w: World) -> dict:
    return {"slug": w.acme.slug}


def withdrawn_in_acme(w: World) -> dict:
    from moderation.models import WithdrawnAnswer  # noqa: PLC0415

    return {**acme(w), "review_id": WithdrawnAnswer.objects.get(conversation=w.conversation).pk}


def dave_in_acme(w: World) -> dict:
    return {**acme(w), "user_id": w.dave.pk}


def alice_id(w: World) -> dict:
    return {"user_id": w.alice.pk}


CONTENT = form(content="pwned")
# Views that answer every method (Django's form views take PUT as POST; some pages and the
# probes do not restrict methods and answer others as GET): each method they answer is tried.
ANY = ("GET", "POST", "PUT", "PATCH", "DELETE")

ROUTES: list[Route] = [
    # --- chat ---
    Route("home", ("GET",), SELF),
    Route("turn-create-new", ("POST",), SELF, bodies={"POST": CONTENT}, generates=True),
    Route(
        "conversation", ("GET",), WORKSPACE_READ, conv, why="dave reads what is shared with Acme"
    ),
    Route("turn-create", ("POST",), OWN, conv, bodies={"POST": CONTENT}, generates=True),
    # A page of earlier exchanges: another's conversation is 404 before the cursor is looked at.
    Route("conversation-earlier", ("GET",), OWN, conv, query="before=00000000-0000-4000-8000-000000000000"),
    Route("turn-events", ("GET",), OWN, question),
    Route("turn-stop", ("POST",), OWN, question),
    Route("turn-edit", ("POST",), OWN, question, bodies={"POST": CONTENT}, generates=True),
    Route("answer-regenerate", ("POST",), OWN, answer, generates=True),
    Route("answer-continue", ("POST",), OWN, answer, generates=True),
    Route("answer-version", ("GET", "POST"), OWN, answer),
    Route("question-select", ("POST",), OWN, question),
    Route("conversation-export", ("GET",), OWN, lambda w: {**conv(w), "extension": "json"}),
    Route("conversation-rename", ("POST",), OWN, conv, bodies={"POST": form(title="pwned")}),
    Route("conversation-pin", ("POST",), OWN, conv),
    Route("conversation-delete", ("POST",), OWN, conv),
    Route(
        "conversation-instructions", ("POST",), OWN, conv, bodies={"POST": form(system_prompt="pwned")}
    ),
    Route("conversation-discard", ("POST",), OWN, conv),
    # A search that alice's conversation matches: it must not show up for anyone else.
    Route("conversation-search", ("GET",), SELF, query="q=axolotl"),
    Route("conversation-workspace", ("POST",), OWN, conv, bodies={"POST": form(shared="0")}),
    # --- accounts ---
    Route("api-keys", ("GET", "POST"), SELF, bodies={"POST": form(name="mine")}),
    Route("api-key-revoke", ("POST",), OWN, lambda w: {"key_id": w.alice_key.pk}),
    Route(
        "login",
        ("GET", "POST", "PUT"),
        PUBLIC,
        bodies={"POST": form(username="alice", password="wrong-guess-123")},
        why="signing in is how one stops being anonymous",
    ),
    Route(
        "logout",
        ("POST",),
        PUBLIC,
        why="signing out needs no sign-in (it ends only the caller's own session)",
    ),
    Route(
        "signup", ANY, PUBLIC, bodies={"POST": form(username="")}, why="anyone may make an account"
    ),
    Route(
        "password_change",
        ("GET", "POST", "PUT"),
        SELF,
        bodies={
            "POST": form(
                old_password=PASSWORD,
                new_password1="pwned-pwned-pwned-1",
                new_password2="pwned-pwned-pwned-1",
            )
        },
    ),
    Route("password_change_done", ("GET",), SELF),
    Route(
        "password_reset",
        ("GET", "POST", "PUT"),
        PUBLIC,
        bodies={"POST": form(email="")},
        why="a forgotten password is asked for signed out; the page is the same whether or not "
        "an account exists",
    ),
    Route("password_reset_done", ("GET",), PUBLIC, why="the 'check your email' page holds no data"),
    Route(
        "password_reset_confirm",
        ANY,
        PUBLIC,
        lambda w: {"uidb64": _uid(w.alice), "token": "bogus-token"},
        bodies={
            "POST": form(new_password1="pwned-pwned-pwned-1", new_password2="pwned-pwned-pwned-1")
        },
        why="the emailed reset link is the credential; a wrong token changes nothing",
    ),
    Route("password_reset_complete", ("GET",), PUBLIC, why="the 'password set' page holds no data"),
    Route("sessions", ("GET",), SELF),
    Route("session-end", ("POST",), OWN, lambda w: {"session_id": w.alice_session.pk}),
    Route("sessions-end-others", ("POST",), SELF),
    Route("sessions-end-all", ("POST",), SELF),
    # --- usage, settings, moderation ---
    Route("usage", ("GET",), SELF),
    Route("org-usage", ("GET",), ORG_ADMINS_HIDDEN, acme),
    Route("settings", ("GET",), SELF),
    Route(
        "org-moderation",
        ("GET", "POST"),
        ORG_ADMINS_HIDDEN,
        acme,
        bodies={"POST": form(blocked_terms="pwned", moderation_fail_open="on")},
    ),
    Route("org-moderation-review", ("GET",), ORG_ADMINS_HIDDEN, acme),
    Route("org-moderation-review-fine", ("POST",), ORG_ADMINS_HIDDEN, withdrawn_in_acme),
    # --- memory ---
    Route("memory-settings", ("GET", "POST"), SELF, bodies={"POST": form(text="likes pwning")}),
    Route("memory-settings-duplicate", ANY, SELF),
    Route("memory-delete", ("POST",), OWN, lambda w: {"fact_id": w.fact.pk}),
    Route("memory-clear", ("POST",), SELF, bodies={"POST": form(confirm="yes")}),
    Route("memory-toggle", ("POST",), SELF, bodies={"POST": form(enabled="")}),
    Route("memory-update-undo", ("POST",), OWN, lambda w: {"update_id": w.memory_update.pk}),
    Route("theme-set", ("POST",), SELF, bodies={"POST": form(theme="dark")}),
    Route(
        "custom-instructions-set", ("POST",), SELF, bodies={"POST": form(custom_instructions="pwned")}
    ),
    Route("training-opt-out-set", ("POST",), SELF, bodies={"POST": form(training_opt_out="on")}),
    # --- workspaces ---
    Route(
        "org-list",
        ("GET", "POST"),
        SELF,
        bodies={"POST": form(name="Mine", slug="mine", region="")},
    ),
    Route("org-overview", ("GET",), ORG_MEMBERS, acme),
    Route(
        "org-conversations", ("GET",), ORG_MEMBERS, acme, why="dave reads what is shared with Acme"
    ),
    Route("org-members", ("GET",), ORG_MEMBERS, acme),
    Route("org-member-remove", ("POST",), ORG_ROLE, dave_in_acme),
    Route(
        "org-member-role", ("POST",), ORG_ROLE, dave_in_acme, bodies={"POST": form(role="owner")}
    ),
    # dave may leave (his own seat): only outsiders are refused.
    Route("org-leave", ("POST",), ORG_MEMBERS, acme),
    Route(
        "org-invitations",
        ("GET", "POST"),
        ORG_ROLE,
        acme,
        bodies={"POST": form(email="", role="member")},
    ),
    Route(
        "org-invitation-revoke",
        ("POST",),
        ORG_ROLE,
        lambda w: {**acme(w), "invitation_id": w.invitation.pk},
    ),
    Route(
        "org-policies",
        ("GET", "POST"),
        ORG_ROLE,
        acme,
        bodies={
            "POST": form(region=lambda w: w.acme.region, not_for_training="on", rate_limit_rpm="1")
        },
    ),
    # The link is the credential (who holds it may see what it invites to): its organisation's
    # name is shown even when withdrawn.
    Route(
        "invitation-accept",
        ("GET", "POST"),
        WITHDRAWN_INVITATION,
        lambda w: {"token": w.raw["withdrawn_invitation"]},
        reveals=("org",),
    ),
    # --- sharing ---
    Route("share-manage", ("GET", "POST"), OWN, conv),
    Route("share-update", ("POST",), OWN, lambda w: {**conv(w), "link_id": w.link.pk}),
    Route("share-revoke", ("POST",), OWN, lambda w: {**conv(w), "link_id": w.link.pk}),
    Route("shared-links", ("GET",), SELF),
    # A working link is public by design (test_a_working_share_link_is_public); a revoked one
    # is dead for everyone.
    Route(
        "shared",
        ("GET",),
        REVOKED_LINK,
        lambda w: {"token": w.raw["revoked_link"]},
        why="a working link is public: the link is the credential",
    ),
    Route(
        "shared-continue", ("GET", "POST"), REVOKED_LINK, lambda w: {"token": w.raw["revoked_link"]}
    ),
    # --- attachments, feedback, audit ---
    Route(
        "attachment-download",
        ("GET",),
        WORKSPACE_READ,
        lambda w: {**conv(w), "attachment_id": w.attachment.pk},
        why="files go with the conversation",
    ),
    Route(
        "answer-feedback",
        ("POST",),
        OWN,
        answer,
        bodies={"POST": form(rating="down", comment="pwned")},
    ),
    Route("org-audit", ("GET",), ORG_ROLE, acme),
    # --- privacy ---
    Route("privacy-data", ("GET",), SELF),
    Route("privacy-export", ("POST",), SELF),
    Route("chats-import", ("POST",), SELF, bodies={"POST": lambda w: Body("file", {"field": "file"})}),
    Route("account-delete", ("GET", "POST"), SELF, bodies={"POST": form(password=PASSWORD)}),
    Route(
        "account-deleted",
        ("GET",),
        PUBLIC,
        why="the goodbye page after a deletion: there is no account any more",
    ),
    Route("org-export", ("GET", "POST"), ORG_ROLE, acme),
    Route(
        "org-delete",
        ("GET", "POST"),
        ORG_ROLE,
        acme,
        bodies={"POST": form(slug="acme", password=PASSWORD)},
    ),
    # --- operations ---
    Route(
        "metrics",
        ANY,
        PUBLIC,
        why="Prometheus scrapes each process; counters by pool and tier only, no user data. "
        "Deployments keep it off the internet (docs/operations.md: an nginx allow-list)",
    ),
    Route("healthz", ANY, PUBLIC, why="liveness probe of load balancers; no user data"),
    Route("readyz", ANY, PUBLIC, why="readiness probe of load balancers; no user data"),
    # --- projects (issue 30): acme's members open alice's workspace project; only its owner
    # and acme's owners and admins change it (dave: 403) ---
    Route("project-new", ("GET", "POST"), SELF, bodies={"POST": form(name="bob's")}),
    Route("sidebar-projects", ("GET",), SELF),
    Route("project", ("GET",), ORG_MEMBERS, project, why="acme's members open acme's projects"),
    Route("project-files", ("GET",), ORG_MEMBERS, project, why="acme's members see its projects' files"),
    Route("project-rename", ("POST",), ORG_ROLE, project, bodies={"POST": form(name="pwned")}),
    Route("project-instructions", ("POST",), ORG_ROLE, project, bodies={"POST": form(instructions="pwned")}),
    Route("project-files-add", ("POST",), ORG_ROLE, project, bodies={"POST": lambda w: Body("file", {"field": "files"})}),
    Route(
        "project-file-delete", ("POST",), ORG_ROLE,
        lambda w: {**project(w), "file_id": w.project_file.pk},
    ),  # fmt: skip
    Route("project-delete", ("POST",), ORG_ROLE, project),
    # --- /v1 ---
    Route(
        "v1-conversations",
        ("GET", "POST"),
        API_SELF,
        query="q=axolotl",
        bodies={"POST": js(system_prompt="x")},
    ),
    Route("v1-conversation", ("GET", "DELETE"), API_OWN, conv),
    Route("v1-projects", ("GET", "POST"), API_SELF, bodies={"POST": js(name="bob's")}),
    Route(
        "v1-project", ("GET", "PATCH", "DELETE"), API_OWN, personal_project,
        bodies={"PATCH": js(instructions="pwned")},
    ),  # fmt: skip
    Route(
        "v1-turns",
        ("POST",),
        API_OWN,
        conv,
        bodies={"POST": js(role="user", content="pwned")},
        generates=True,
    ),
    Route("v1-turn-events", ("GET",), API_OWN, answer),
    Route("v1-turn-regenerate", ("POST",), API_OWN, answer, generates=True),
    Route("v1-cancel", ("POST",), API_OWN, conv),
    Route(
        "v1-attachments",
        ("POST",),
        API_OWN,
        conv,
        bodies={"POST": lambda w: Body("file", {"field": "file"})},
    ),
    Route(
        "v1-answer-feedback",
        ("POST",),
        API_OWN,
        answer,
        bodies={"POST": js(rating="down", comment="pwned")},
    ),
    Route(
        "v1-user-memory",
        ("GET", "PATCH"),
        API_OWN,
        alice_id,
        bodies={"PATCH": js(remove=lambda w: [str(w.fact.pk)], add=["pwned"])},
    ),
    Route("v1-user-export", ("GET",), API_OWN, alice_id),
    Route(
        "v1-chat-completions",
        ("POST",),
        API_SELF,
        bodies={
            "POST": js(model="SmolLM2-135M-Instruct", messages=[{"role": "user", "content": "hi"}])
        },
        generates=True,
    ),
    Route(
        "v1-completions",
        ("POST",),
        API_SELF,
        bodies={"POST": js(model="SmolLM2-135M-Instruct", prompt="hi")},
        generates=True,
    ),
    Route("v1-models", ("GET",), API_SELF),
    Route("v1-embeddings", ("POST",), API_SELF, bodies={"POST": js(model="all-MiniLM-L6-v2", input="hi")}),
    # Imports into the caller's own account only (no conversation id to aim at another's).
    Route("v1-imports", ("POST",), API_SELF, bodies={"POST": lambda w: Body("file", {"field": "file"})}),
    # A project's files (issue 30), alice's workspace project: as on its page, acme's members
    # list them, only its owner and acme's owners/admins add and delete (projects/api.py).
    Route("v1-project-files", ("GET",), API_ORG_MEMBERS, project, why="acme's members see its projects' files"),
    Route("v1-project-files", ("POST",), API_ORG_ROLE, project, bodies={"POST": lambda w: Body("file", {"field": "file"})}),
    Route(
        "v1-project-file", ("DELETE",), API_ORG_ROLE,
        lambda w: {"project_id": w.project.pk, "file_id": w.project_file.pk},
    ),
    Route(
        "v1-openapi",
        ("GET",),
        API_PUBLIC,
        why="the API's description: no data, readable before one has a key",
    ),
    # The admin's own sign-in page (every other admin/ route: the ADMIN rule).
    Route("admin:login", ("GET", "POST", "PUT"), PUBLIC, why="the admin's sign-in page"),
]

# Routes that exist only with a setting on; covered when present, not stale when absent.
OPTIONAL_PUBLIC = {
    "oidc_authentication_init": "OpenID Connect sign-in starts signed out (CHAT_OIDC_ENABLED)",
    "oidc_authentication_callback": (
        "the provider sends the browser back signed out (CHAT_OIDC_ENABLED)"
    ),
}

BY_NAME = {r.name: r for r in ROUTES}


def _uid(user) -> str:
    return urlsafe_base64_encode(force_bytes(user.pk))
