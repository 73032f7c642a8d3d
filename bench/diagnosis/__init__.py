"""The diagnosis benchmark: planted faults with known causes, run through hyprun's method.

    python -m bench.diagnosis [--only NAME ...] [--seeds K] [--jobs 2] [--out DIR]

See `bench/diagnosis/scenarios.yaml` for the scenarios and `bench/diagnosis/run.py` for what one
scenario does.
"""
