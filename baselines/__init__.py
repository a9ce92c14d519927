"""Baselines."""
