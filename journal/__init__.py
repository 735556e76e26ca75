"""journal package (see DESIGN.md)."""
