"""custom_ops."""
