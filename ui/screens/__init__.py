"""The TUI's screens, one module each (ui/registry.py lists them)."""
