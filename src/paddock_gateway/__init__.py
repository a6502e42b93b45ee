"""paddock_gateway."""
