"""Where a checkpoint lives: tags are one path component under the save directory, and `latest` names one.

A tag becomes a directory that a save replaces wholesale, so a tag that is empty, `.`, `..`, absolute
or holds a separator would replace (or write outside) the checkpoint root itself. Tags are checked
before anything is written; `latest` is read as the untrusted file it is (it may sit on a shared file
system anyone can write to).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import CheckpointLoadError, DstrainError
from .files import COMMON_FILE

LATEST = "latest"
MAX_TAG_LENGTH = 200  # bytes; with ".partial" / ".old" appended it stays under the usual 255-byte name limit
_RESERVED_SUFFIXES = (".partial", ".old", ".tmp")
TAG_RULE = (f"a tag is one directory name: non-empty, at most {MAX_TAG_LENGTH} bytes of UTF-8, not '.' or '..', "
            f"no '/' or '\\', no NUL or line break, no leading or trailing space, not {LATEST!r}, not ending in "
            f"{', '.join(_RESERVED_SUFFIXES)}")


def tag_problem(tag: str) -> str | None:
    """What is wrong with `tag` as a checkpoint tag, or None."""
    if not isinstance(tag, str):
        return f"is a {type(tag).__name__}"
    if not tag:
        return "is empty"
    if tag in (".", ".."):
        return f"is {tag!r}"
    if any(bad in tag for bad in ("/", "\\", "\0", "\n", "\r")):
        return "holds a path separator, NUL or line break"
    if tag != tag.strip():
        return "has leading or trailing whitespace"
    if len(tag.encode("utf-8", "surrogatepass")) > MAX_TAG_LENGTH:
        return f"is {len(tag.encode('utf-8', 'surrogatepass'))} bytes long"
    if tag == LATEST or tag.endswith(_RESERVED_SUFFIXES):
        return "is reserved for dstrain's own files"
    return None


def check_tag(tag: str) -> str:
    """`tag` itself when it is a valid tag; DstrainError naming it and the rule otherwise."""
    problem = tag_problem(tag)
    if problem is not None:
        raise DstrainError(f"checkpoint tag {tag!r} {problem}; {TAG_RULE}")
    return tag


def read_latest(root: Path) -> str | None:
    """The tag `root/latest` names, or None when there is no such file."""
    path = root / LATEST
    if not path.is_file():
        return None
    with open(path, "rb") as handle:
        raw = handle.read(MAX_TAG_LENGTH + 64)
        if handle.read(1):
            raise CheckpointLoadError(f"{path} is larger than any tag can be ({MAX_TAG_LENGTH} bytes); it is not "
                                      f"a dstrain 'latest' file")
    try:
        tag = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise CheckpointLoadError(f"{path} is not UTF-8 text; it should hold one checkpoint tag") from None
    problem = tag_problem(tag)
    if problem is not None:
        raise CheckpointLoadError(f"{path} names {tag!r}, which {problem}; {TAG_RULE}")
    return tag


def tag_directory(root: Path, tag: str) -> Path:
    """`root/tag`, refused when a link would take it outside `root`."""
    path = root / tag
    real_root = Path(os.path.realpath(root))
    real = Path(os.path.realpath(path))
    if real.parent != real_root:
        raise CheckpointLoadError(f"checkpoint {path} resolves to {real}, outside {real_root}; a checkpoint must be "
                                  f"a directory inside the checkpoint root, not a link out of it")
    return path


def checked_load_tag(tag: str) -> str:
    """`tag` when valid; CheckpointLoadError naming it and the rule otherwise."""
    try:
        return check_tag(tag)
    except DstrainError as exc:
        raise CheckpointLoadError(str(exc)) from None


def checkpoint_path(root: Path, tag: str) -> Path:
    """The complete dstrain checkpoint of `tag` under `root` (its `.old` copy when a re-save of the tag was
    interrupted mid-swap); CheckpointLoadError listing the complete tags otherwise."""
    path = tag_directory(root, tag)
    if (path / COMMON_FILE).is_file():
        return path
    old = tag_directory(root, f"{tag}.old")
    if (old / COMMON_FILE).is_file():
        return old
    tags = sorted(p.name for p in root.iterdir() if (p / COMMON_FILE).is_file()) if root.is_dir() else []
    if (root / f"{tag}.partial").exists():
        reason = f"the save of {tag!r} did not finish (only {tag}.partial is there)"
    elif path.exists():
        reason = f"{path} is not a dstrain checkpoint ({COMMON_FILE} missing)"
    else:
        reason = f"{path} does not exist"
    raise CheckpointLoadError(f"cannot load checkpoint: {reason}; complete checkpoints in {root}: "
                              f"{', '.join(tags) or 'none'}")
