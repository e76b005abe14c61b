"""A checkpoint directory's manifest: every file it holds, with its size and a SHA-256, itself checksummed.

Files that carry their own data checksums (dsaio's safetensors files: a CRC-32 per chunk and one over
the index, all in the header) are covered through their header: hashing the header pins those
checksums, and dsaio verifies the data against them as it reads. Every other file (JSON metadata,
small text) is hashed whole. Loading checks the manifest before reading anything else: a flipped
bit, a truncated, missing, extra or renamed file, or a manifest edited by hand is an error that
names the file, never a silent load.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path
from typing import Any

from ..errors import CheckpointError
from .atomic import write_text_atomically

MANIFEST = "manifest.json"
FORMAT = "dstrain-manifest-1"
_SAFETENSORS = ".safetensors"
_MAX_HEADER = 100_000_000  # as safetensors' own limit
_MAX_PLAIN_FILE = 256 * 1024 * 1024  # metadata files are small; a huge one is not ours


def write_manifest(directory: Path) -> dict[str, Any]:
    """Hash every file under `directory` (recursively) into `directory/manifest.json`."""
    files = {rel: _describe(directory / rel) for rel in _files_under(directory)}
    manifest = {"format": FORMAT, "files": files, "sha256": _digest_of(files)}
    write_text_atomically(directory / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
    return manifest


def verify_manifest(directory: Path) -> None:
    """Raise CheckpointError unless `directory` holds exactly the files its manifest lists, unchanged."""
    path = directory / MANIFEST
    if not path.is_file():
        raise CheckpointError(f"{directory}: no {MANIFEST}, so nothing in this checkpoint can be verified (it was "
                              f"written by an older version, or the file was removed); refusing to load it")
    manifest = _read_manifest(path)
    files = manifest["files"]
    on_disk = set(_files_under(directory))
    missing, extra = sorted(set(files) - on_disk), sorted(on_disk - set(files))
    if missing or extra:
        raise CheckpointError(f"{directory}: the files differ from {MANIFEST}: missing {missing[:5] or 'none'}, "
                              f"not listed {extra[:5] or 'none'}")
    for rel, expected in files.items():
        actual = _describe(directory / rel)
        if actual != expected:
            what = "size" if actual["size"] != expected.get("size") else "checksum"
            raise CheckpointError(f"{directory / rel}: {what} does not match {MANIFEST} (the file was changed or "
                                  f"damaged after it was saved)")


def _read_manifest(path: Path) -> dict[str, Any]:
    if path.stat().st_size > _MAX_PLAIN_FILE:
        raise CheckpointError(f"{path}: {path.stat().st_size} bytes is far too large for a manifest")
    try:
        manifest = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise CheckpointError(f"{path}: not a valid manifest ({type(exc).__name__}: {exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a {FORMAT} manifest")
    files = manifest.get("files")
    well_formed = isinstance(files, dict) and all(
        isinstance(rel, str) and isinstance(entry, dict) and isinstance(entry.get("size"), int)
        and isinstance(entry.get("sha256"), str) for rel, entry in files.items())
    if not well_formed:
        raise CheckpointError(f"{path}: the manifest's file list is malformed")
    if manifest.get("sha256") != _digest_of(files):
        raise CheckpointError(f"{path}: the manifest's own checksum does not match its contents (edited or damaged)")
    return manifest


def _files_under(directory: Path) -> list[str]:
    found = []
    for root, dirs, names in os.walk(directory):
        dirs.sort()
        for name in sorted(names):
            rel = os.path.relpath(os.path.join(root, name), directory)
            if rel != MANIFEST:
                found.append(Path(rel).as_posix())
    return found


def _describe(path: Path) -> dict[str, Any]:
    if path.is_symlink() or not path.is_file():
        raise CheckpointError(f"{path}: not a regular file (a checkpoint holds only regular files)")
    size = path.stat().st_size
    if path.suffix == _SAFETENSORS:
        return {"size": size, "sha256": _header_digest(path, size), "covers": "header"}
    if size > _MAX_PLAIN_FILE:
        raise CheckpointError(f"{path}: {size} bytes is too large for a metadata file")
    return {"size": size, "sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "covers": "content"}


def _header_digest(path: Path, size: int) -> str:
    with open(path, "rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise CheckpointError(f"{path}: truncated ({size} bytes, no safetensors header)")
        (length,) = struct.unpack("<Q", prefix)
        if length > min(_MAX_HEADER, size - 8):
            raise CheckpointError(f"{path}: header length {length} does not fit the file's {size} bytes")
        return hashlib.sha256(prefix + handle.read(length)).hexdigest()


def _digest_of(files: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(files, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
