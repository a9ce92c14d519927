"""NEST harness."""
