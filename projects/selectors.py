"""Every read of projects, permission-checked (issue 30).

**Who may do what.** A personal project (``org`` None) is its owner's alone. A workspace project
(``org`` set) is the organisation's: its *current* members open it, read its instructions and
files, and start their own chats in it (each member's chats stay their own: nobody reads another
member's chat through the project); only its owner (while a member) or the organisation's owners
and admins change its name, instructions and files or delete it. Membership is read on every
call (one indexed query on the global database, none for a personal project), so a member who
leaves or is removed loses the project on the very next request, like the organisation's
conversations (conversations/selectors.py ``conversation_get_for_user``).

Anyone else (another user, another organisation's member, an ex-member, an unknown id) gets the
same Http404, so an id never reveals that a project exists; a member who may open the project
but not change it gets PermissionDenied (403) saying who can.

**Where.** A project's id names its region (core/regions.py ``new_conversation_id``),
so every read by id goes straight to that region's database; listings ask every region's.
"""

from __future__ import annotations

from uuid import UUID

from asgiref.sync import sync_to_async
from django.core.exceptions import PermissionDenied
from django.db.models import Q
from django.http import Http404

from accounts.models import Membership, User
from conversations.models import Conversation
from core import regions
from projects.models import Project, ProjectFile
from projects.sources import sources_by_answer  # noqa: F401 - re-exported: an answer's sources

NOT_FOUND = "No such project."
EDITORS = (Membership.Role.OWNER, Membership.Role.ADMIN)


def _objects(model, *, project_id: UUID, user: User):
    """``model``'s manager on the database of project ``project_id`` (from its id)."""
    return regions.manager(model, regions.db_for_conversation_id(project_id, user=user), user_id=user.pk)


def _role(user: User, org_id: int) -> str | None:
    """``user``'s role in organisation ``org_id`` now, or None (not a member)."""
    return (
        Membership.objects.filter(organisation_id=org_id, user_id=user.pk)
        .values_list("role", flat=True)
        .first()
    )


def project_get_for_user(*, project_id: UUID, user: User) -> Project:
    """The project ``user`` may open (module docstring). Raises Http404 if it is missing *or*
    not theirs to open (anonymous, not its owner, not a current member of its organisation)."""
    if not getattr(user, "is_authenticated", False):
        raise Http404(NOT_FOUND)
    project = _objects(Project, project_id=project_id, user=user).filter(project_id=project_id).first()
    if project is None:
        raise Http404(NOT_FOUND)
    if project.org_id is None:
        if project.owner_id != user.pk:
            raise Http404(NOT_FOUND)
        return project
    role = _role(user, project.org_id)
    if role is None:
        raise Http404(NOT_FOUND)
    project.viewer_role = role  # read by project_can_edit: no second membership query
    return project


aproject_get_for_user = sync_to_async(project_get_for_user)


def project_can_edit(*, project: Project, user: User) -> bool:
    """Whether ``user``, who may open ``project`` (:func:`project_get_for_user`), may change or
    delete it: the owner of a personal project; for a workspace project its owner or the
    organisation's owners and admins (a current member, which opening it checked)."""
    if project.org_id is None:
        return project.owner_id == user.pk
    role = getattr(project, "viewer_role", None) or _role(user, project.org_id)
    return role is not None and (project.owner_id == user.pk or role in EDITORS)


def project_get_for_editing(*, project_id: UUID, user: User) -> Project:
    """:func:`project_get_for_user`, for someone who may change it (:func:`project_can_edit`).
    Raises Http404 as that does, and PermissionDenied (403, with who can) for a member who may
    only open it."""
    project = project_get_for_user(project_id=project_id, user=user)
    if not project_can_edit(project=project, user=user):
        raise PermissionDenied(
            "Only this project's owner and the organisation's owners and admins change it; "
            "ask one of them."
        )
    return project


aproject_get_for_editing = sync_to_async(project_get_for_editing)


def project_list(*, user: User) -> list[Project]:
    """The projects ``user`` may open: their personal ones and those of every organisation they
    belong to now, most recently changed first (every region's database; sync: reads the
    memberships)."""
    org_ids = list(Membership.objects.filter(user_id=user.pk).values_list("organisation_id", flat=True))
    mine = Q(owner_id=user.pk, org__isnull=True) | Q(org_id__in=org_ids)
    return list(
        regions.merged(
            [
                objects.filter(mine).order_by("-updated_at", "-created_at")
                for objects in regions.managers(Project, user=user)
            ],
            key=lambda p: (p.updated_at, p.created_at),
            reverse=True,
        )
    )


def project_conversations(*, project: Project, user: User):
    """``user``'s own chats in ``project`` (a project they may open), most recently active
    first (a QuerySet on the project's database). Other members' chats are never listed."""
    return (
        regions.manager(Conversation, regions.db_for_conversation_id(project.pk, user=user), user_id=user.pk)
        .filter(project_id=project.pk, owner_id=user.pk, temporary=False)
        .order_by("-last_turn_at", "-created_at")
    )


def project_files(*, project: Project):
    """``project``'s files, oldest first (a QuerySet on its database). The caller checked the
    reader may open the project."""
    return regions.manager(ProjectFile, regions.db_for_conversation_id(project.pk)).filter(
        project_id=project.pk
    ).order_by("created_at", "file_id")


def project_file_get(*, project: Project, file_id: UUID) -> ProjectFile:
    """File ``file_id`` of ``project``. Raises Http404 if it is not one of its files."""
    found = project_files(project=project).filter(file_id=file_id).first()
    if found is None:
        raise Http404("No such file.")
    return found
