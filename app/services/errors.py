"""The one error type services raise; routes turn it into an HTTP 4xx with its message."""

from __future__ import annotations


class ServiceError(Exception):
    """A request the service cannot honour. ``status`` is the HTTP code, ``field`` what was wrong."""

    def __init__(self, message: str, *, status: int = 400, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.field = field


class NotFound(ServiceError):
    def __init__(self, what: str, ident: object) -> None:
        super().__init__(f"{what} {ident!r} not found", status=404, field="id")


# `pipeboard train`'s exit code when its run was lost (a worker process killed, hung or gone without
# a word) rather than stopped by an error it reported: the service retries such an attempt.
RUN_LOST_EXIT = 75  # EX_TEMPFAIL


class PhaseFailed(ServiceError):
    """A job phase's process ended badly with ``returncode`` (negative: killed by that signal)."""

    def __init__(self, message: str, returncode: int) -> None:
        super().__init__(message, status=500)
        self.returncode = returncode

    @property
    def retryable(self) -> bool:
        """Killed, or lost a process: the same attempt again could succeed (an error of the job's
        own, such as a bad configuration or an exception in its code, would only repeat)."""
        return self.returncode < 0 or self.returncode == RUN_LOST_EXIT
