"""paddock_hostagent."""
