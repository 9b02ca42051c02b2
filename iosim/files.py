"""Writing what a user asked for: never half a file, never over one they did not mean to replace."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .errors import IosimError


def check_writable(path: Path, what: str, force: bool = False) -> None:
    """One line if `path` cannot be written as `what` (a missing or unwritable folder, a folder in its place, a
    file already there without `force`)."""
    if path.is_dir():
        raise IosimError(f"{what}: {path} is a directory; give a file name")
    if path.exists() and not force:
        raise IosimError(f"{what}: {path} exists; pass --force to overwrite it")
    folder = path.parent
    if not folder.is_dir():
        raise IosimError(f"{what}: no directory {folder}")
    if not os.access(folder, os.W_OK):
        raise IosimError(f"{what}: cannot write in {folder} (permission denied)")


def write_text(path: Path, text: str, what: str) -> None:
    """`text` to `path` whole or not at all: written beside it, then renamed over it."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as e:
        if "tmp" in locals() and Path(tmp).exists():
            Path(tmp).unlink()
        raise IosimError(f"{what}: cannot write {path}: {e.strerror or e}") from None


def check_out_dir(folder: Path, what: str) -> None:
    """One line if `folder` cannot take pages (a file in its place, an unwritable parent or folder)."""
    if folder.exists() and not folder.is_dir():
        raise IosimError(f"{what}: {folder} is a file, not a directory")
    probe = folder if folder.exists() else next((p for p in folder.parents if p.exists()), Path("."))
    if not os.access(probe, os.W_OK):
        raise IosimError(f"{what}: cannot write in {probe} (permission denied)")
