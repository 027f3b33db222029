"""Writing files and folders so that a reader, or a crash, never finds half of one."""

from __future__ import annotations

import ctypes
import errno
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
    """Put the complete folder `new` at `target`, whose old folder is then removed. Where the
    file system can (Linux: ext4, xfs, btrfs, tmpfs), the two are swapped in one step, so `target`
    always holds a complete folder; elsewhere the old one is renamed aside and `new` renamed in
    (restored if that fails): `target` is then empty between the two renames, never partial."""
    if not target.exists():
        os.rename(new, target)
        return
    if exchange(new, target):
        shutil.rmtree(new)  # the old folder, now under the hidden name
        return
    old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", dir=target.parent))
    os.rename(target, old)  # onto the empty placeholder: a directory may replace an empty one
    try:
        os.rename(new, target)
    except BaseException:
        os.rename(old, target)
        raise
    shutil.rmtree(old)


RENAME_EXCHANGE, AT_FDCWD = 2, -100  # linux/fs.h, fcntl.h


def exchange(first: Path, second: Path) -> bool:
    """Swap two paths atomically (renameat2 RENAME_EXCHANGE); False where the C library or the
    file system cannot (macOS, NFS, old kernels), so the caller falls back to two renames."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        return False
    if renameat2(AT_FDCWD, os.fsencode(first), AT_FDCWD, os.fsencode(second), RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(first), None, str(second))
