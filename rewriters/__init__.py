"""rewriters."""
