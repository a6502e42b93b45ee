"""Benchmarks: Paddock against the floor and a peer, in one run (``make bench``; ``make bench-smoke``)."""
