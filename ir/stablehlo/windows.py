"""Handlers: (being written)."""
