"""A team's accounts on an MLflow server with basic-auth (slurm/local/store_up.sh calls this).

Each user gets an account with a generated password, written to `FOLDER/NAME.env` (0600) as the
three variables MLflow's client reads, and EDIT on the team's experiments (created by the admin
when missing). Everyone else signed in reads them (the server's `default_permission`). Run as
the admin: MLFLOW_TRACKING_USERNAME/PASSWORD in the environment.

    python -m hyprun.runner.store.team http://127.0.0.1:5050 /var/lib/hyprun-store/users \
        --users ana bo --edit hyprun
"""

from __future__ import annotations

import argparse
import os
import secrets
import warnings
from pathlib import Path


def enrol(uri: str, folder: Path, users: list[str], experiments: list[str]) -> list[Path]:
    """Accounts for `users` (kept when they exist: their files stay valid) with EDIT on
    `experiments`; the credential files written."""
    from mlflow.exceptions import RestException
    from mlflow.tracking import MlflowClient

    from hyprun.runner.store.access import WRITES
    from hyprun.runner.store.tracking import experiment_id

    with warnings.catch_warnings():  # the auth client imports the server: starlette's notice
        warnings.simplefilter("ignore")
        from mlflow.server.auth.client import AuthServiceClient

    auth, tracking = AuthServiceClient(uri), MlflowClient(uri)
    ids = [experiment_id(tracking, name) for name in experiments]
    written = []
    for user in users:
        path = folder / f"{user}.env"
        if not path.exists():
            password = secrets.token_urlsafe(18)
            try:
                auth.create_user(user, password)
            except RestException as error:
                raise SystemExit(
                    f"team: account {user!r} exists but {path} does not: delete the account "
                    f"or restore its file ({error.error_code})"
                ) from None
            _write_private(path, uri, user, password)
        for experiment in ids:
            held = auth.get_user_permission(user, "experiment", experiment).permission
            if held not in WRITES:  # a rerun keeps what an account holds
                auth.grant_user_permission(user, "experiment", experiment, "EDIT")
        written.append(path)
    return written


def _write_private(path: Path, uri: str, user: str, password: str) -> None:
    """The user's credentials, readable by the owner only from the moment the file exists."""
    lines = [
        f"MLFLOW_TRACKING_URI={uri}",
        f"MLFLOW_TRACKING_USERNAME={user}",
        f"MLFLOW_TRACKING_PASSWORD={password}",
    ]
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m hyprun.runner.store.team")
    parser.add_argument("uri", help="the tracking server, e.g. http://127.0.0.1:5050")
    parser.add_argument("folder", type=Path, help="where each user's NAME.env goes")
    parser.add_argument("--users", nargs="+", required=True)
    parser.add_argument("--edit", nargs="*", default=["hyprun"], help="experiments they edit")
    args = parser.parse_args(argv)
    args.folder.mkdir(parents=True, exist_ok=True)
    for path in enrol(args.uri, args.folder, args.users, args.edit):
        print(f"credentials: {path}")


if __name__ == "__main__":
    main()
