"""What the sha256 in a checkpoint's COMPLETE manifest costs: at the save (flush and hash every
file) and at a resume's check (read and hash them again), against sizes alone and the flush a save does anyway.

    .venv/bin/python benchmarks/checkpoint_checksum.py [--mb 10 538] [--folder CHECKPOINT]

Each size is a folder of random files shaped like a checkpoint (the policy a third, AdamW's
state two thirds), written to a temporary folder on the disk of /tmp and removed; `--folder`
measures an existing checkpoint as it is. The files are in the page cache, as they are right
after a save; a cold read from disk adds the disk's time to both columns of a resume alike.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import zlib
from pathlib import Path

from grpo_dist.controller.manifest import MANIFEST, check_complete, write_manifest


def fake_checkpoint(folder: Path, mb: int) -> None:
    (folder / "policy").mkdir(parents=True)
    for name, share in (("policy/model.safetensors", 1), ("optimizer.pt", 2)):
        with (folder / name).open("wb") as handle:
            for _ in range(mb * share // 3):
                handle.write(os.urandom(1 << 20))


def crc32_seconds(folder: Path) -> float:
    """The same read with zlib.crc32 instead of sha256 (the cheaper choice not taken)."""
    started = time.perf_counter()
    for path in folder.rglob("*"):
        if path.is_file():
            crc = 0
            with path.open("rb") as handle:
                while chunk := handle.read(1 << 20):
                    crc = zlib.crc32(chunk, crc)
    return time.perf_counter() - started


def measure(folder: Path) -> dict[str, float]:
    (folder / MANIFEST).unlink(missing_ok=True)
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    started = time.perf_counter()
    for path in folder.rglob("*"):  # the save's flush, which the manifest did before it hashed
        if path.is_file():
            with path.open("rb") as handle:
                os.fsync(handle.fileno())
    flush = time.perf_counter() - started
    started = time.perf_counter()
    write_manifest(folder, "bench")  # flushed already: this is the hashing
    save = time.perf_counter() - started
    started = time.perf_counter()
    check_complete(folder, contents=False)
    sizes = time.perf_counter() - started
    started = time.perf_counter()
    check_complete(folder)
    hashed = time.perf_counter() - started
    return {"mb": round(size / 1e6, 1), "fsync_s": round(flush, 3), "save_manifest_s": round(save, 3), "check_sizes_s": round(sizes, 4),
            "check_sha256_s": round(hashed, 3), "crc32_read_s": round(crc32_seconds(folder), 3)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, nargs="*", default=[10, 538])
    parser.add_argument("--folder", type=Path, help="an existing checkpoint (its COMPLETE is rewritten)")
    args = parser.parse_args()
    if args.folder:
        print(json.dumps({"folder": str(args.folder), **measure(args.folder)}))
    for mb in args.mb:
        with tempfile.TemporaryDirectory() as scratch:
            fake_checkpoint(Path(scratch) / "step", mb)
            print(json.dumps(measure(Path(scratch) / "step")))


if __name__ == "__main__":
    main()
