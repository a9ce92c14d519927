"""Model spec -> layer graph."""
