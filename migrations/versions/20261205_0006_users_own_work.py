"""users own their work: a users table, each token a user's, jobs, models, profiles and contexts owned

Every token that exists becomes the `admin` user's (created here), and so does every job, model and
profile, and every stored context (one access row each). New tokens name their user.

Revision ID: 0006
Revises: 0004
Create Date: 2026-12-05 23:30:00

"""
from datetime import datetime, timezone
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


revision: str = '0006'
down_revision: Union[str, Sequence[str], None] = '0005'  # chained after 0005 (job spec v2) by the lead at merge: keep
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

FIRST_USER = 'admin'  # the name app/services/tokens.py gives the first start's user
OWNED = ('jobs', 'models', 'profiles')


def upgrade() -> None:
    users = op.create_table(
        'users',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('name', sa.String(length=120), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_users')),
        sa.UniqueConstraint('name', name=op.f('uq_users_name')),
    )
    op.create_table(
        'context_access',
        sa.Column('sha256', sa.String(length=64), nullable=False),
        sa.Column('user_id', sa.Integer(), nullable=False),
        sa.Column('granted_by', sa.Integer(), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['sha256'], ['contexts.sha256'], name=op.f('fk_context_access_sha256_contexts'),
                                ondelete='CASCADE'),
        sa.ForeignKeyConstraint(['user_id'], ['users.id'], name=op.f('fk_context_access_user_id_users'),
                                ondelete='CASCADE'),
        sa.ForeignKeyConstraint(['granted_by'], ['users.id'], name=op.f('fk_context_access_granted_by_users'),
                                ondelete='SET NULL'),
        sa.PrimaryKeyConstraint('sha256', 'user_id', name=op.f('pk_context_access')),
    )
    op.create_index(op.f('ix_context_access_user_id'), 'context_access', ['user_id'], unique=False)
    bind = op.get_bind()
    now = datetime.now(timezone.utc)
    op.bulk_insert(users, [{'id': 1, 'name': FIRST_USER, 'created_at': now}])
    admin_id = bind.execute(sa.text('SELECT id FROM users WHERE name = :name'), {'name': FIRST_USER}).scalar_one()
    if bind.dialect.name == 'postgresql':  # the explicit id above left the sequence behind it
        bind.execute(sa.text("SELECT setval(pg_get_serial_sequence('users', 'id'), (SELECT max(id) FROM users))"))

    with op.batch_alter_table('api_tokens', recreate='auto') as batch:
        batch.add_column(sa.Column('user_id', sa.Integer(), nullable=True))
    bind.execute(sa.text('UPDATE api_tokens SET user_id = :admin'), {'admin': admin_id})
    with op.batch_alter_table('api_tokens', recreate='auto') as batch:
        batch.alter_column('user_id', existing_type=sa.Integer(), nullable=False)
        batch.create_foreign_key(op.f('fk_api_tokens_user_id_users'), 'users', ['user_id'], ['id'], ondelete='CASCADE')
        batch.create_index(op.f('ix_api_tokens_user_id'), ['user_id'], unique=False)

    for table in OWNED:
        with op.batch_alter_table(table, recreate='auto') as batch:
            batch.add_column(sa.Column('owner_id', sa.Integer(), nullable=True))
            batch.create_foreign_key(op.f(f'fk_{table}_owner_id_users'), 'users', ['owner_id'], ['id'], ondelete='SET NULL')
            batch.create_index(op.f(f'ix_{table}_owner_id'), ['owner_id'], unique=False)
        bind.execute(sa.text(f'UPDATE {table} SET owner_id = :admin'), {'admin': admin_id})
    bind.execute(sa.text('INSERT INTO context_access (sha256, user_id, granted_by, created_at) '
                         'SELECT sha256, :admin, NULL, :now FROM contexts'), {'admin': admin_id, 'now': now})


def downgrade() -> None:
    for table in reversed(OWNED):
        with op.batch_alter_table(table, recreate='auto') as batch:
            batch.drop_index(op.f(f'ix_{table}_owner_id'))
            batch.drop_constraint(op.f(f'fk_{table}_owner_id_users'), type_='foreignkey')
            batch.drop_column('owner_id')
    with op.batch_alter_table('api_tokens', recreate='auto') as batch:
        batch.drop_index(op.f('ix_api_tokens_user_id'))
        batch.drop_constraint(op.f('fk_api_tokens_user_id_users'), type_='foreignkey')
        batch.drop_column('user_id')
    op.drop_index(op.f('ix_context_access_user_id'), table_name='context_access')
    op.drop_table('context_access')
    op.drop_table('users')
