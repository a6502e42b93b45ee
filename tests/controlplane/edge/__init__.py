"""Tests of src/paddock_controlplane/edge/: the API's framing, errors and fast lane, identity, the ingress."""
