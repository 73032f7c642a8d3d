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
# OpenMP threads that wait for work spin first: on a machine shared with other jobs a spinning
# thread holds a core the thread it waits for needs. Side by side (2 cores, load ~6), gpt_tiny at
# 2 threads ran 1.5-10.6k tokens/s with libgomp's default wait and 38-45k passive (1 thread:
# 20-45k). Set before torch loads libgomp, which reads it once; OMP_WAIT_POLICY=active keeps spin.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
