"""The controller: baseline, diagnosis, the one-variable rule, tests, verdicts, strikes, sweeps."""
