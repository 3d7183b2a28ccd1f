"""How deep a JSON document nests, measured without parsing it.

Python's json parser, and pydantic after it, recurse once per level: a body of 100,000 `[` is a
RecursionError (a 500), and a `config` nested 500 deep was stored and then broke every later
listing that serialised it. Bodies are measured here first, in C-speed passes over the bytes (no
recursion, no per-byte Python loop): string literals are cut out, every byte but brackets is
dropped, and the running depth's maximum is taken.
"""

from __future__ import annotations

import re
from itertools import accumulate

MAX_JSON_DEPTH = 32
# A JSON string literal: a quote, then non-quote non-backslash bytes or escaped pairs, a quote.
STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def json_depth(data: bytes) -> int:
    """The deepest nesting of arrays and objects in `data` (0 for a scalar); for text that is not
    JSON, what its brackets outside string literals add up to."""
    brackets = STRING.sub(b"", data).translate(None, NOT_BRACKETS)
    if not brackets:
        return 0
    return max(0, max(accumulate(STEP[b] for b in brackets)))


def nesting_problem(data: bytes, what: str) -> str | None:
    """The one-line 422 message for a document nested past MAX_JSON_DEPTH, naming `what`; None when fine."""
    if json_depth(data) > MAX_JSON_DEPTH:
        return f"{what}: JSON nested more than {MAX_JSON_DEPTH} levels deep"
    return None
