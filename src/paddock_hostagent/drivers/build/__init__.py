"""Template builds: buildah and each owner's builder storage."""
