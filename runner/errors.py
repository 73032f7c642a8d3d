"""The one error type the CLI turns into a one-line message and exit code 2."""


class BadInput(Exception):
    """Input refused before anything starts; the message names the problem and the fix."""

    exit_code = 2
