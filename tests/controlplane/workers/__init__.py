"""Tests of src/paddock_controlplane/workers/: the reconciler's orphaned boots, webhook delivery."""
