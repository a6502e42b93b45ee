"""The OCI container runtime: spec, cgroups, seccomp, boot, the warm pool and parking."""
