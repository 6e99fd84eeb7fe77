"""User-facing errors.

An ``EmberError`` is raised for bad input or bad settings: its message says what is wrong,
where (file:line or setting), and what to do. The CLI prints it without a traceback.
"""


class EmberError(Exception):
    """A problem the user can fix (bad file, bad setting, missing data)."""
