"""The face: the `hyprun` command line (`main`), the report and the demo."""
