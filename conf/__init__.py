"""Hydra configuration tree of hyprun, shipped as a package so `pkg://conf` finds it."""
