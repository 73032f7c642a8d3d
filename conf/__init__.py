"""Hydra configuration tree of hyprun, shipped as a package so `pkg://hyprun.conf` finds it."""
