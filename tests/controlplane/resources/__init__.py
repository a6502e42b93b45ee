"""Tests of src/paddock_controlplane/resources/: accounts, access tokens, billing, networks, webhooks."""
