"""The error types the CLI turns into a one-line message: exit code 2 (refused) or 1 (failed)."""


class BadInput(Exception):
    """Input refused before anything starts; the message names the problem and the fix."""

    exit_code = 2


class JobsFailed(Exception):
    """Jobs the cluster cancelled or failed, or that crashed: infrastructure, not evidence."""

    exit_code = 1


class TrackingOffline(Exception):
    """The server stayed away past the grace period; the evidence is on disk."""

    exit_code = 1
