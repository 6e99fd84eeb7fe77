"""One module per CLI verb; see ``ember/cli.py``."""
