"""hyprun's runner: the job, the launchers, the store and the controller."""

import os

# MLflow 3 starts a telemetry client at import that sends usage events out and, when the client
# is reset, pops an environment variable other threads read: a KeyError race that failed one
# job of a long benchmark process twice (bench.diagnosis.split, 2026-12-01). hyprun's jobs run
# where nothing outside can be reached; set MLFLOW_DISABLE_TELEMETRY=false to keep it on.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
# MLflow draws a "Downloading artifacts" progress bar on stderr for every artifact read, even a
# config of a few hundred bytes: four per report, more in the demo. Off unless the user sets it.
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
