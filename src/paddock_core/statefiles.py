"""Private state on disk: directories 0700, files 0600, whatever the process umask is.

Databases, keys and records under a data directory are readable by the service's user only, as
``secrets.env`` always was: a SQLite file holds every user's balance, key hashes and sealed secrets.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: Path) -> Path:
    """Create ``path`` (and missing parents) as 0700. An existing directory is left as it is: it may be
    shared (``/tmp``, a home) and was not made by us."""
    if not path.is_dir():
        path.mkdir(parents=True, exist_ok=True)
        os.chmod(path, DIR_MODE)  # mkdir's mode is filtered by the umask
    return path


def restrict_file(path: Path) -> None:
    """Take group and other access away from an existing file we own (one made 0644 by an older
    version); a missing file, or one owned by someone else on purpose, is left alone."""
    with contextlib.suppress(FileNotFoundError, PermissionError):
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            os.chmod(path, mode & ~0o077)


def private_file(path: Path) -> Path:
    """Make sure ``path`` exists as a 0600 file (created empty when missing)."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE))
    restrict_file(path)
    return path
