"""The Textual TUI: a client of the controller API, never imported by the core."""
