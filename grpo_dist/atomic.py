"""Writing files and folders so that a reader, or a crash, never finds half of one."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON through a temporary file and a rename, so readers never see half a file."""
    staging = path.with_name(f".{path.name}.tmp")
    staging.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(staging, path)


def fsync_dir(path: Path) -> None:
    handle = os.open(path, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def copy_atomic(source: Path, target: Path) -> None:
    staging = target.with_name(f".{target.name}.tmp")
    shutil.copyfile(source, staging)
    os.replace(staging, target)


def replace_folder(new: Path, target: Path) -> None:
    """Put the complete folder `new` at `target`: an old folder there is renamed aside, `new`
    renamed in, and only then the old one removed (restored if the second rename fails). The
    path is empty only between the two renames; it never holds a partial folder."""
    if not target.exists():
        os.rename(new, target)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", dir=target.parent))
    os.rename(target, old)  # onto the empty placeholder: a directory may replace an empty one
    try:
        os.rename(new, target)
    except BaseException:
        os.rename(old, target)
        raise
    shutil.rmtree(old)
