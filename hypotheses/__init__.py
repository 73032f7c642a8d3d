"""Hypothesis cards (YAML data), shipped as a package so an installed hyprun finds them."""
