"""The script's own workers package."""
