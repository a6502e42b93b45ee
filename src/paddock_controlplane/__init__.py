"""paddock_controlplane."""
