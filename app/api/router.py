"""All `/api/v1` routes, gathered in one router that `pipeboard.app.main` mounts.

Every route but `/health` needs a token, reads included (the event stream and the trace download
too): the routers declare `require_token` (read scope enough). Routes that change something ask
for more with their own dependency, which reuses the same per-request principal. The tokens
router declares its needs route by route instead (admin for management, any token for
`/tokens/me`), so that minting without a token hears "admin token", not "write token".
tests/app/test_api_security.py walks every route to check that none answers without a token.
"""

from fastapi import APIRouter, Depends

from pipeboard.app.api.routes import (contexts, events, health, jobs, models, plans, profiles, schedules, tokens, tune,
                                      workers)
from pipeboard.app.api.security import require_token

api_router = APIRouter(prefix="/api/v1")
api_router.include_router(health.router)
for _module in (contexts, models, profiles, plans, tune, schedules, jobs, events, workers):
    api_router.include_router(_module.router, dependencies=[Depends(require_token)])
api_router.include_router(tokens.router)
