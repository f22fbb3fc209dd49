"""Errors that end a command with a one-line message and an exit code.

`PackError` is bad input or environment (exit 2): its message names the file, key or node and
says what to do. Anything else escaping a command is a bug and shows a traceback.
"""


class PackError(Exception):
    """Bad input or environment: one line, names the culprit and the fix; exit code 2."""

    exit_code = 2

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message
