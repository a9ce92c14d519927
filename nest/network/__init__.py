"""Topology -> levels; collective and point-to-point costs."""
