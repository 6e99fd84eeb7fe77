"""User-facing errors.

An ``EmberError`` is raised for bad input or bad settings: its message says what is wrong,
where (file:line or setting), and what to do. The CLI prints it without a traceback.
"""


class EmberError(Exception):
    """A problem the user can fix (bad file, bad setting, missing data)."""


class RequestError(EmberError):
    """A request that cannot be answered as sent (HTTP ``status``, 4xx): the message says which
    field is wrong and what to send instead. Raised by the inference methods' ``parse``, so the
    Python API and the HTTP server refuse the same inputs with the same words."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
