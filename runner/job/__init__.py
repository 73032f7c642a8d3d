"""The controlled training job: config -> model, data, DeepSpeed engine -> training loop -> MLflow.

The only part of hyprun that imports torch and DeepSpeed at module level. Everything above it
(launch, control, cli) reads a job's outcome as a `hyprun.runner.job.result.JobResult`.
"""
