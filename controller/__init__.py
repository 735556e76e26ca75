"""controller package (see DESIGN.md)."""
