"""worker package (see DESIGN.md)."""
