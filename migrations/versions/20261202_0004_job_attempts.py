"""job attempts (automatic resume from checkpoints) and the hosts each ran on; worker hosts' names

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02 12:00:00

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


revision: str = '0004'
down_revision: Union[str, Sequence[str], None] = '0003'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

STATUS = sa.Enum('queued', 'running', 'succeeded', 'failed', 'cancelled', name='attempt_status', native_enum=False,
                 create_constraint=True, length=16)


def upgrade() -> None:
    op.create_table(
        'job_attempts',
        sa.Column('job_id', sa.Integer(), nullable=False),
        sa.Column('attempt', sa.Integer(), nullable=False),
        sa.Column('trigger', sa.String(length=8), nullable=False),
        sa.Column('status', STATUS, nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('train_started_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('offset_s', sa.Float(), nullable=True),
        sa.Column('resume_step', sa.Integer(), nullable=True),
        sa.Column('error', sa.Text(), nullable=True),
        sa.Column('hosts', sa.JSON(), nullable=True),
        sa.Column('nodes', sa.Integer(), nullable=False),
        sa.Column('rendezvous', sa.String(length=300), nullable=True),
        sa.Column('prefer_node', sa.String(length=255), nullable=True),
        sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_job_attempts_job_id_jobs'), ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('job_id', 'attempt', name=op.f('pk_job_attempts')),
    )
    op.create_table(
        'attempt_nodes',
        sa.Column('job_id', sa.Integer(), nullable=False),
        sa.Column('attempt', sa.Integer(), nullable=False),
        sa.Column('node', sa.String(length=255), nullable=False),
        sa.Column('host', sa.String(length=255), nullable=False),
        sa.Column('role', sa.String(length=8), nullable=False),
        sa.Column('joined_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('heartbeat_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('pgid', sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_attempt_nodes_job_id_jobs'), ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('job_id', 'attempt', 'node', name=op.f('pk_attempt_nodes')),
    )
    # rows measured before attempts were kept apart belong to the first
    with op.batch_alter_table('timeline_events', schema=None) as batch_op:
        batch_op.add_column(sa.Column('attempt', sa.Integer(), nullable=False, server_default='1'))
    with op.batch_alter_table('metric_points', schema=None) as batch_op:
        batch_op.add_column(sa.Column('attempt', sa.Integer(), nullable=False, server_default='1'))
    with op.batch_alter_table('worker_heartbeats', schema=None) as batch_op:
        batch_op.add_column(sa.Column('host', sa.String(length=255), nullable=True))
        batch_op.add_column(sa.Column('address', sa.String(length=255), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('worker_heartbeats', schema=None) as batch_op:
        batch_op.drop_column('address')
        batch_op.drop_column('host')
    with op.batch_alter_table('metric_points', schema=None) as batch_op:
        batch_op.drop_column('attempt')
    with op.batch_alter_table('timeline_events', schema=None) as batch_op:
        batch_op.drop_column('attempt')
    op.drop_table('attempt_nodes')
    op.drop_table('job_attempts')
