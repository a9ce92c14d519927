"""What the user specifies: model, hardware and cluster catalogs, training settings, precision."""
