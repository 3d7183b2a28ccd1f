"""Pydantic shapes of the REST API, one module per resource: `XCreate` for what clients send,
`XPublic` for what they get. Everything is importable from here (`from pipeboard.app.schemas import X`).

Validation lives here so that bad input becomes a 422 naming the field before any route code
runs; the few checks that need the database (unknown model, live hosts) happen in `app/services/`
and raise `ServiceError`, which the routes turn into 4xx.

- common.py: pages, error bodies, schedule names, levels, limits
- jobspec.py: the job specification (what `POST /jobs` takes and a run receives)
- jobs.py, plans.py, profiles.py, models.py, contexts.py, schedules.py, tokens.py: the resources
"""

from pipeboard.app.schemas.common import (
    DEFAULT_CHECKPOINT_EVERY, MAX_JOB_NODES, MAX_JOB_WORKERS, MAX_PLAN_WORKERS, NAME_PATTERN, JobStatus, Level, Message,
    Method, Page, ScheduleName, ValidationErrorItem, ValidationFailed, WeightGrads, schedule_description, schedule_field,
    total_workers, weight_grads_description, weight_grads_field)
from pipeboard.app.schemas.contexts import ContextPublic
from pipeboard.app.schemas.jobs import (
    AttemptPublic, Fidelity, FidelityTerm, JobPublic, MetricPointPublic, MetricsPublic, TimelineEventPublic, TimelinePublic)
from pipeboard.app.schemas.jobspec import JobSpec, ProfileJobSpec
from pipeboard.app.schemas.models import FACTORY_PATTERN, SHA256_PATTERN, ModelCreate, ModelPublic
from pipeboard.app.schemas.plans import PlanCreate, PlanPending, PlanPublic
from pipeboard.app.schemas.profiles import LayerRow, ProfileCreate, ProfilePublic
from pipeboard.app.schemas.schedules import SchedulePublic
from pipeboard.app.schemas.tokens import MAX_TOKEN_LIFETIME_S, Me, Scope, TokenCreate, TokenCreated, TokenPublic

__all__ = [
    "DEFAULT_CHECKPOINT_EVERY", "FACTORY_PATTERN", "MAX_JOB_NODES", "MAX_JOB_WORKERS", "MAX_PLAN_WORKERS",
    "MAX_TOKEN_LIFETIME_S", "NAME_PATTERN", "SHA256_PATTERN", "AttemptPublic", "ContextPublic", "Fidelity", "FidelityTerm",
    "JobPublic", "JobSpec", "JobStatus", "LayerRow", "Level", "Me", "Message", "MetricPointPublic", "MetricsPublic",
    "Method", "ModelCreate", "ModelPublic", "Page", "PlanCreate", "PlanPending", "PlanPublic", "ProfileCreate", "ProfileJobSpec",
    "ProfilePublic", "SchedulePublic", "ScheduleName", "Scope", "TimelineEventPublic", "TimelinePublic", "TokenCreate",
    "TokenCreated", "TokenPublic", "ValidationErrorItem", "ValidationFailed", "WeightGrads", "schedule_description",
    "schedule_field", "total_workers", "weight_grads_description", "weight_grads_field",
]
