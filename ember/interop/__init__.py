"""Hugging Face checkpoint import/export: one name map per family."""
