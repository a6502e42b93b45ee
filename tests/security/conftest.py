"""Security probes (issue #12): each runs an attack from inside real sandboxes or from outside against the
live services and asserts it is refused. Fixtures live in each probe module or its ``*_support.py``."""
