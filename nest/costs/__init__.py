"""Roofline compute, memory model -> cost tables."""
