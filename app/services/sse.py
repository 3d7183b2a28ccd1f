"""Server-Sent Events framing (the `text/event-stream` wire format), kept apart from any I/O."""

from __future__ import annotations

import json
from typing import Any


def frame(data: Any, *, event: str | None = None, id: int | None = None, retry_ms: int | None = None) -> str:
    """One SSE message. ``data`` is JSON-encoded; a newline inside it starts a new ``data:`` line."""
    lines = []
    if retry_ms is not None:
        lines.append(f"retry: {int(retry_ms)}")
    if id is not None:
        lines.append(f"id: {int(id)}")
    if event:
        if "\n" in event or "\r" in event:
            raise ValueError("SSE event names cannot contain newlines")
        lines.append(f"event: {event}")
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    lines.extend(f"data: {part}" for part in payload.split("\n"))
    return "\n".join(lines) + "\n\n"


def comment(text: str = "") -> str:
    """A comment line: ignored by clients, keeps proxies from closing an idle stream."""
    return f": {text}\n\n"


def parse_stream(text_lines):
    """Parse SSE lines (an iterable of str without newlines) into dicts {id, event, data}.

    Used by the CLI and tests; a small reader rather than a dependency.
    """
    event: dict[str, Any] = {}
    data_lines: list[str] = []
    for line in text_lines:
        if line == "":
            if data_lines:
                event["data"] = "\n".join(data_lines)
                yield event
            event, data_lines = {}, []
            continue
        if line.startswith(":"):
            continue
        key, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if key == "data":
            data_lines.append(value)
        elif key in ("id", "event", "retry"):
            event[key] = value
    if data_lines:
        event["data"] = "\n".join(data_lines)
        yield event
