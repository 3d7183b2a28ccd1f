"""tokens: the admin scope, and an optional expiry

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02 00:00:00

Scopes are VARCHAR + CHECK (pipeboard.app.models._str_enum): widening them is a new CHECK constraint,
which batch mode does on SQLite by recreating the table, and ALTER TABLE does on PostgreSQL.
"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


revision: str = '0002'
down_revision: Union[str, Sequence[str], None] = '0001'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def scope_type(*values: str) -> sa.Enum:
    return sa.Enum(*values, name='token_scope', native_enum=False, create_constraint=True, length=16)


def upgrade() -> None:
    with op.batch_alter_table('api_tokens', schema=None) as batch_op:
        batch_op.add_column(sa.Column('expires_at', sa.DateTime(timezone=True), nullable=True))
        batch_op.alter_column('scope', existing_type=scope_type('read', 'write'), type_=scope_type('read', 'write', 'admin'),
                              existing_nullable=False)


def downgrade() -> None:
    # Before this revision `write` tokens managed tokens too: admin tokens become write tokens.
    op.execute("UPDATE api_tokens SET scope = 'write' WHERE scope = 'admin'")
    with op.batch_alter_table('api_tokens', schema=None) as batch_op:
        batch_op.alter_column('scope', existing_type=scope_type('read', 'write', 'admin'), type_=scope_type('read', 'write'),
                              existing_nullable=False)
        batch_op.drop_column('expires_at')
