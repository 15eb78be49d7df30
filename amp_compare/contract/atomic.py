"""Atomic file writes (temporary file in the same folder, fsync, rename).

A reader never sees a half-written file: it sees the old one or the new one. Used for every
record, report and cached download.

`tempfile.mkstemp` creates its file with mode 0600, and a rename keeps that mode: every file
written here is given the mode a plain `open(path, "w")` would give it instead (0666 less the
umask), so a report folder can be served or shared like any other. Standard library only, but for
contract/env.py's reader of /proc/self/status.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def current_umask() -> int:
    """The process's umask, read without changing it where Linux shows it (/proc/self/status)."""
    from amp_compare.contract.env import proc_status  # imported here: everything else in this file is stdlib

    try:
        return int(proc_status("Umask") or "", 8)
    except ValueError:
        pass
    mask = os.umask(0o022)  # elsewhere: read it by setting it, and put it back at once
    os.umask(mask)
    return mask


def usual_file_mode() -> int:
    """The mode open() gives a new file: 0666 less the umask (0644 under the common umask 022)."""
    return 0o666 & ~current_umask()


def temporary_sibling(path: Path) -> tuple[int, str]:
    """mkstemp beside `path` (same file system, so the rename is atomic), with the usual file mode."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, usual_file_mode())
    except BaseException:
        os.close(fd)
        Path(tmp).unlink(missing_ok=True)
        raise
    return fd, tmp


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    fd, tmp = temporary_sibling(path)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        if exc.filename is None:  # a failed write names no file: name the one being written (a full disk)
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))
