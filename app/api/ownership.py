"""Whose work a request may see and act on: users own their jobs, plans, models, profiles and contexts.

A token belongs to a user (app/models.py `User`); what it creates is that user's. A token of scope
`admin` sees and acts on everyone's work. Anyone else asking for another user's job, plan,
model, profile or context hears the same 404 as for one that does not exist, never a 403 that
would tell them it is there. A principal without a user (PIPEBOARD_AUTH=off on loopback, or
reads opened with PIPEBOARD_READ_AUTH=false) sees everything, as before users.

Contexts are stored once by content but owned per user: an access row for each user who uploaded
the same bytes or was shared them (`POST /contexts/{sha}/share`).
"""

from __future__ import annotations

from sqlalchemy import ColumnElement, select, true
from sqlalchemy.orm import Session

from pipeboard.app.api.security import Principal
from pipeboard.app.models import CodeContext, ContextAccess, Job, Model, Plan, Profile
from pipeboard.app.services import jobs, plans
from pipeboard.app.services.errors import NotFound, ServiceError


def sees_all(principal: Principal) -> bool:
    return principal.user_id is None or principal.is_admin


def owner_scope(principal: Principal) -> int | None:
    """The owner a listing is limited to; None: every owner's rows."""
    return None if sees_all(principal) else principal.user_id


def owns(principal: Principal, owner_id: int | None) -> bool:
    return sees_all(principal) or (owner_id is not None and owner_id == principal.user_id)


def job_for(session: Session, principal: Principal, job_id: int) -> Job:
    """The job, if this principal may see it; 404 as for a missing one otherwise."""
    job = jobs.get(session, job_id)
    if not owns(principal, job.owner_id):
        raise NotFound("job", job_id)
    return job


def plan_for(session: Session, principal: Principal, plan_id: int) -> Plan:
    """The plan (a what-if's, or a job's), if this principal may see it; 404 as for a missing one."""
    row = plans.get(session, plan_id)
    if not owns(principal, row.owner_id):
        raise NotFound("plan", plan_id)
    return row


def model_visible(principal: Principal, row: Model) -> bool:
    return owns(principal, row.owner_id)


def model_row(session: Session, ref: str) -> Model | None:
    """A registered model by id or name (None for a zoo name or nothing)."""
    if ref.isdigit() and len(ref) < 12:
        return session.get(Model, int(ref))
    return session.scalar(select(Model).where(Model.name == ref))


def check_job_model(session: Session, principal: Principal, name: str, field: str = "model.name") -> None:
    """A job may name only a zoo model or a registered model its submitter can see; another
    user's model reads as unknown, as one that does not exist."""
    row = session.scalar(select(Model).where(Model.name == name))
    if row is not None and not model_visible(principal, row):
        from pipeboard.trainer import zoo

        raise ServiceError(f"{field}: unknown model {name!r}; known: {', '.join(zoo.names())}, or a registered "
                           "model (POST /api/v1/models)", status=422, field=field)


def context_filter(principal: Principal) -> ColumnElement[bool]:
    """Contexts this principal may see: one of its access rows exists (everything for an admin)."""
    if sees_all(principal):
        return true()
    return CodeContext.sha256.in_(select(ContextAccess.sha256).where(ContextAccess.user_id == principal.user_id))


def context_visible(session: Session, principal: Principal, digest: str) -> bool:
    return session.scalar(select(CodeContext.sha256).where(CodeContext.sha256 == digest, context_filter(principal))) is not None


def context_for(session: Session, principal: Principal, digest: str) -> CodeContext:
    row = session.scalar(select(CodeContext).where(CodeContext.sha256 == digest, context_filter(principal)))
    if row is None:
        raise NotFound("context", digest)
    return row


def grant_context(session: Session, digest: str, user_id: int, granted_by: int | None = None) -> bool:
    """Give `user_id` access to a stored context; False when it had it already. The caller commits."""
    if session.get(ContextAccess, (digest, user_id)) is not None:
        return False
    session.add(ContextAccess(sha256=digest, user_id=user_id, granted_by=granted_by))
    session.flush()
    return True


def profile_visible(session: Session, principal: Principal, row: Profile) -> bool:
    """An uploaded profile is its uploader's; one a job measured is as visible as its model (a zoo
    model's measurements are everyone's: the zoo is)."""
    if sees_all(principal) or row.owner_id == principal.user_id:
        return True
    if row.owner_id is not None:
        return False
    if row.model_id is None:
        return True
    model = session.get(Model, row.model_id)
    return model is not None and model_visible(principal, model)


def profile_filter(principal: Principal) -> ColumnElement[bool]:
    """The SQL form of `profile_visible`, for listings."""
    if sees_all(principal):
        return true()
    mine = Profile.owner_id == principal.user_id
    measured = Profile.owner_id.is_(None) & (
        Profile.model_id.is_(None) | Profile.model_id.in_(select(Model.id).where(Model.owner_id == principal.user_id)))
    return mine | measured
