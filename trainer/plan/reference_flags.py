"""The PipeDream reference optimizer's command-line flags, as `pipeboard.trainer.plan.plan()` keywords.

`optimizer_graph_hierarchical.py -n 4 4 -b 10e9 1.25e9 --straight_pipeline ...` becomes
`{"levels": [(4, 10e9), (4, 1.25e9)], "straight": True, ...}`, so a plan recorded with the
reference's flags (as in the shared reference-plans.jsonl) can be re-made here.
"""

from __future__ import annotations


def parse_reference_flags(args: str) -> dict:
    tokens = args.split()
    out = {"straight": False, "memory_constraint": False, "memory_bytes": None, "activation_compression": None}
    workers, bandwidths = [], []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok in ("-n", "-b"):
            i += 1
            while i < len(tokens) and not tokens[i].startswith("-"):
                (workers if tok == "-n" else bandwidths).append(float(tokens[i]))
                i += 1
            continue
        if tok == "--straight_pipeline":
            out["straight"] = True
        elif tok == "--use_memory_constraint":
            out["memory_constraint"] = True
        elif tok == "-s":
            out["memory_bytes"] = float(tokens[i + 1])
            i += 1
        elif tok == "--activation_compression_ratio":
            out["activation_compression"] = float(tokens[i + 1])
            i += 1
        i += 1
    out["levels"] = [(int(w), b) for w, b in zip(workers, bandwidths)]
    return out
