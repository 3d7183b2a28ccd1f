"""All `/api/v1` routes, gathered in one router that `pipeboard.app.main` mounts."""

from fastapi import APIRouter

from pipeboard.app.api.routes import contexts, events, health, jobs, models, plans, profiles, schedules, tokens

api_router = APIRouter(prefix="/api/v1")
api_router.include_router(health.router)
for _module in (contexts, models, profiles, plans, schedules, jobs, events, tokens):
    api_router.include_router(_module.router)
