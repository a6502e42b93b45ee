"""paddock."""
