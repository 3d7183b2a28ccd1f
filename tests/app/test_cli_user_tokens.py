"""`pipeboard token create --user`: an admin's way, on the server machine, to make a user's token."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from pipeboard.app.core.db import make_engine
from pipeboard.app.models import ApiToken, Base, User
from tests.app.test_api_cli import run


def test_token_create_for_a_user_makes_the_user_once_and_defaults_to_admin(tmp_path: Path):
    url = f"sqlite:///{tmp_path}/t.sqlite"
    engine = make_engine(url)
    Base.metadata.create_all(engine)
    env = {"PIPEBOARD_DATABASE_URL": url}
    for name, user in (("laptop", "alice"), ("ci", "alice"), ("desk", None)):
        made = run("token", "create", name, "--scope", "write", *(["--user", user] if user else []), env=env)
        assert made.returncode == 0, made.stderr
        assert f"of user {user or 'admin'!r}" in made.stderr
    with Session(engine) as s:
        owners = dict(s.execute(select(ApiToken.name, User.name).join(User, User.id == ApiToken.user_id)).all())
        assert owners == {"laptop": "alice", "ci": "alice", "desk": "admin"}
        assert sorted(s.scalars(select(User.name))) == ["admin", "alice"]
    refused = run("token", "create", "x", "--user", "bad/name", env=env)
    assert refused.returncode == 2 and "--user" in refused.stderr and refused.stderr.count("\n") == 1, refused.stderr
    engine.dispose()
