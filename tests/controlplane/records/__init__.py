"""Tests of src/paddock_controlplane/records/: migrations and the status watch."""
