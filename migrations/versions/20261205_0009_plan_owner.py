"""plans are owned like jobs: plans.owner_id

A what-if's plan is its requester's: others hear 404 for it, an admin sees every plan. Every plan
that exists becomes the `admin` user's, as 0006 made every job, model and profile.

Revision ID: 0009
Revises: 0007
Create Date: 2026-12-06 01:30:00

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


revision: str = '0009'
down_revision: Union[str, Sequence[str], None] = '0007'  # the newest head when written (no 0008 yet): the lead chains it at merge
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

FIRST_USER = 'admin'  # the user 0006 made every existing token and row belong to


def upgrade() -> None:
    with op.batch_alter_table('plans', recreate='auto') as batch:
        batch.add_column(sa.Column('owner_id', sa.Integer(), nullable=True))
        batch.create_foreign_key(op.f('fk_plans_owner_id_users'), 'users', ['owner_id'], ['id'], ondelete='SET NULL')
        batch.create_index(op.f('ix_plans_owner_id'), ['owner_id'], unique=False)
    op.get_bind().execute(sa.text('UPDATE plans SET owner_id = (SELECT id FROM users WHERE name = :name)'),
                          {'name': FIRST_USER})


def downgrade() -> None:
    with op.batch_alter_table('plans', recreate='auto') as batch:
        batch.drop_index(op.f('ix_plans_owner_id'))
        batch.drop_constraint(op.f('fk_plans_owner_id_users'), type_='foreignkey')
        batch.drop_column('owner_id')
