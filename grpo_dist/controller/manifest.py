"""A checkpoint's COMPLETE manifest: every file with its size and sha256, and the run it belongs to.

Written last, after every file is on disk, so a folder without it was never finished. Checked
before a resume starts anything: sizes find a missing or truncated file, the sha256 finds bytes
changed in place (a file whose size is right), and the run id a checkpoint copied in from
another run. Manifests written before the checksums and run ids were added are checked by size.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

MANIFEST = "COMPLETE"
RUN_ID = "RUN_ID"  # RUN_DIR/checkpoints/RUN_ID: made at the run's first save, named by every manifest


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be resumed from; the message says which and why."""


def run_id(folder: Path) -> str:
    """The id of the run whose checkpoints are in `folder` (RUN_DIR/checkpoints), made on first use."""
    path = folder / RUN_ID
    if not path.is_file():
        staging = folder / f".{RUN_ID}.tmp"
        staging.write_text(os.urandom(8).hex() + "\n")
        os.replace(staging, path)
    return path.read_text().strip()


def write_manifest(folder: Path, run: str) -> None:
    """Flush every file to disk, then write COMPLETE listing them with their sizes and sha256."""
    sizes, digests = {}, {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        name = str(path.relative_to(folder))
        with path.open("rb") as handle:
            os.fsync(handle.fileno())
            digests[name] = hashlib.file_digest(handle, "sha256").hexdigest()
        sizes[name] = path.stat().st_size
    with (folder / MANIFEST).open("w") as handle:
        handle.write(json.dumps({"run": run, "files": sizes, "sha256": digests}, indent=1) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def read_manifest(path: Path) -> dict[str, Any]:
    manifest = path / MANIFEST
    if not manifest.is_file():
        raise CheckpointError(f"checkpoint {path} is incomplete: no {MANIFEST} manifest")
    try:
        found = json.loads(manifest.read_text())
        found["files"].items()
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"checkpoint {path} is incomplete: unreadable {MANIFEST} ({exc!r})") from None
    return found


def check_complete(path: Path, contents: bool = True) -> None:
    """Raise CheckpointError, naming the file, unless every file in the manifest is there with its
    size (and, with `contents`, its sha256) and the checkpoint is of the run it is in."""
    manifest = read_manifest(path)
    own = path.parent / RUN_ID
    if "run" in manifest and own.is_file() and own.read_text().strip() != manifest["run"]:
        raise CheckpointError(f"checkpoint {path} is of another run: its {MANIFEST} names run {manifest['run']}, "
                              f"{own} says {own.read_text().strip()} (copied in from another run directory?)")
    for name, size in manifest["files"].items():
        file = path / name
        if not file.is_file() or file.stat().st_size != size:
            found = f"{file.stat().st_size} bytes" if file.is_file() else "missing"
            raise CheckpointError(f"checkpoint {path} is incomplete: {name} is {found}, the manifest says {size} bytes")
    for name, digest in manifest.get("sha256", {}).items() if contents else ():
        with (path / name).open("rb") as handle:
            if hashlib.file_digest(handle, "sha256").hexdigest() != digest:
                raise CheckpointError(f"checkpoint {path} is damaged: {name} is not what was saved (its sha256 "
                                      f"differs from the one in {MANIFEST})")


def is_complete(path: Path, contents: bool = True) -> bool:
    try:
        check_complete(path, contents)
    except CheckpointError:
        return False
    return True
