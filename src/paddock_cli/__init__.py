"""paddock_cli."""
