"""Runtime drivers: the ``SandboxRuntime`` interface (``base``) and its OCI implementation (``oci``)."""
