"""chaos package (see DESIGN.md)."""
