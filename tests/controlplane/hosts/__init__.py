"""Tests of src/paddock_controlplane/hosts/: the host link and the fake host held to its contract."""
