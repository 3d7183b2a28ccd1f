"""code contexts; models validated by a worker (status, message, context); who submitted a job

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02 00:30:00

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


revision: str = '0003'
down_revision: Union[str, Sequence[str], None] = '0002'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

STATUS = sa.Enum('validating', 'ready', 'failed', name='model_status', native_enum=False, create_constraint=True, length=16)


def upgrade() -> None:
    op.create_table(
        'contexts',
        sa.Column('sha256', sa.String(length=64), nullable=False),
        sa.Column('filename', sa.String(length=200), nullable=False),
        sa.Column('kind', sa.String(length=8), nullable=False),
        sa.Column('size', sa.Integer(), nullable=False),
        sa.Column('files', sa.Integer(), nullable=False),
        sa.Column('unpacked_bytes', sa.Integer(), nullable=False),
        sa.Column('content', sa.LargeBinary(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('sha256', name=op.f('pk_contexts')),
    )
    with op.batch_alter_table('models', schema=None) as batch_op:
        batch_op.add_column(sa.Column('context_sha256', sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column('data', sa.String(length=500), nullable=True))
        # models registered before: validated at registration, in the API process. A plain string
        # first; its CHECK comes with the type change below, once the column exists.
        batch_op.add_column(sa.Column('status', sa.String(length=16), nullable=False, server_default='ready'))
        batch_op.add_column(sa.Column('message', sa.Text(), nullable=False, server_default=''))
        batch_op.add_column(sa.Column('layers', sa.Integer(), nullable=True))
        batch_op.create_index(batch_op.f('ix_models_context_sha256'), ['context_sha256'], unique=False)
        batch_op.create_foreign_key(batch_op.f('fk_models_context_sha256_contexts'), 'contexts', ['context_sha256'],
                                    ['sha256'], ondelete='RESTRICT')
    with op.batch_alter_table('models', schema=None) as batch_op:
        batch_op.alter_column('status', existing_type=sa.String(length=16), type_=STATUS, existing_nullable=False,
                              existing_server_default='ready')
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('submitted_by', sa.String(length=200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_column('submitted_by')
    with op.batch_alter_table('models', schema=None) as batch_op:  # the CHECK goes before its column
        batch_op.alter_column('status', existing_type=STATUS, type_=sa.String(length=16), existing_nullable=False)
    with op.batch_alter_table('models', schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f('fk_models_context_sha256_contexts'), type_='foreignkey')
        batch_op.drop_index(batch_op.f('ix_models_context_sha256'))
        batch_op.drop_column('layers')
        batch_op.drop_column('message')
        batch_op.drop_column('status')
        batch_op.drop_column('data')
        batch_op.drop_column('context_sha256')
    op.drop_table('contexts')
