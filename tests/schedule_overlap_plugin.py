"""A schedule module for tests (loaded through PIPEBOARD_SCHEDULES): 1F1B with forwards and
backwards in overlapped pairs (actions.OverlapFB). The last stage runs forward k + 1 with backward
k (which needs only its own earlier forward), the others each steady-state forward with the
backward after it."""

from pipeboard.trainer.schedule.actions import Action, Kind, OverlapFB
from pipeboard.trainer.schedule.flush import one_f_one_b_order, update_ops
from pipeboard.trainer.schedule.registry import known, register

NAME = "1f1b-paired"


def paired_programs(ctx):
    t = ctx.topology
    programs = []
    for w in t.workers:
        s = w.stages[0]
        mbs = t.microbatches_of(w.rank, s, ctx.microbatches)
        if s == t.num_stages - 1:
            order = [(Kind.FORWARD, mbs[0])]
            for prev, mb in zip(mbs, mbs[1:]):
                order += [(Kind.FORWARD, mb), (Kind.BACKWARD, prev)]
            order.append((Kind.BACKWARD, mbs[-1]))
        else:
            order = one_f_one_b_order(mbs, t.noam(s))
        ops, k = [], 0
        while k < len(order):
            kind, mb = order[k]
            nxt = order[k + 1] if k + 1 < len(order) else None
            if kind is Kind.FORWARD and nxt is not None and nxt[0] is Kind.BACKWARD and nxt[1] != mb:
                ops.append(OverlapFB(Action(Kind.FORWARD, s, mb), Action(Kind.BACKWARD, s, nxt[1])))
                k += 2
                continue
            ops.append(Action(kind, s, mb))
            k += 1
        programs.append(ops + update_ops(t, s, 1))
    return programs


if not known(NAME):
    register(NAME, paired_programs, description="1F1B with forwards and backwards in overlapped pairs (a test).",
             replication=False, weight_grads=())
