"""Training apps written the way users write them, with no knowledge of hyprun's internals: the
foreign code hyprun must control as it is (tests/test_apps.py)."""
