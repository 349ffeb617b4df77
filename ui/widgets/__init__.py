"""The TUI's widgets, one module each."""
