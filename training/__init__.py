"""Placeholder package; see DESIGN.md."""
