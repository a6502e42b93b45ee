"""HTTP layer: routes, dependencies, error rendering, the request guard middleware."""
