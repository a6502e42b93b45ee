"""Tests of src/paddock_controlplane/sandboxes/: create and fork rules, lifetimes, processes, states, egress."""
