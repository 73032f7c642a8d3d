"""The evidence store: the only package that talks to MLflow.

`tracking` writes a job's run (batched, spooled through outages) and reads runs back, `spool`
keeps what the server could not take, `investigation` reads and writes an investigation's runs.
"""
