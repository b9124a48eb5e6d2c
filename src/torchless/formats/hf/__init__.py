"""Hugging Face sharded checkpoints: a folder (or its index file) read as one artifact."""
