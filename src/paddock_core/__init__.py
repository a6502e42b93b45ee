"""paddock_core."""
