"""The safe pickle machine (never imports, never calls), its allowlists and the pickle writer."""
