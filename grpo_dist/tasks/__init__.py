"""Built-in tasks and their data."""
