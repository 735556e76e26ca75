"""hipcore package (see DESIGN.md)."""
