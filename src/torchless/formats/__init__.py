"""One handler per format, the registry that detects them, and dispatch between them."""
