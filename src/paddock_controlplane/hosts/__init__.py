"""The fleet: the hosts' inventory and heartbeats (``hosts``), placement (``scheduler``) and the link
to each host agent (``hostlink``).
"""
