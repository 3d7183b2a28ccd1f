"""workers report their GPUs; an attempt holds its GPUs and says why it waits

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-05 23:00:00

``worker_heartbeats.devices``: each worker's GPUs as torch reports them (app/core/devices.py),
refreshed with every heartbeat. ``job_attempts.gpus``: the worker and GPU indices a running
attempt holds (app/services/placement.py), so two jobs never share a GPU. ``job_attempts.waiting``:
why a queued attempt has not started ("waiting: needs 4 GPUs, largest free block 2").
"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


revision: str = '0007'
down_revision: Union[str, Sequence[str], None] = '0006'  # chained after 0006 by the lead at merge: keep
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table('worker_heartbeats') as batch:
        batch.add_column(sa.Column('devices', sa.JSON(), nullable=True))
    with op.batch_alter_table('job_attempts') as batch:
        batch.add_column(sa.Column('gpus', sa.JSON(), nullable=True))
        batch.add_column(sa.Column('waiting', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('job_attempts') as batch:
        batch.drop_column('waiting')
        batch.drop_column('gpus')
    with op.batch_alter_table('worker_heartbeats') as batch:
        batch.drop_column('devices')
