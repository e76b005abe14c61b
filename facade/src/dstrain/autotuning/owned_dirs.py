"""The autotuner's folders and files: written only into folders the autotuner made, never through a link.

The results and experiments folders (autotuning.results_dir / exps_dir) and each experiment's folder
inside the results are made by the tuner, which leaves a marker file in each (`.dstrain_autotuning`,
created exclusively). A later session takes up a folder that holds the marker (that is how earlier
results are reused); a link in a folder's place, a folder of another user, or one without the marker
that is not empty is refused, naming it. An empty folder of this user is taken up as if made.

Every file is reached through a descriptor of its folder (openat-style `dir_fd` calls), so a folder
swapped for a link after it was checked is never entered; files are created with
O_CREAT|O_EXCL|O_NOFOLLOW (a name planted in the meantime fails the create instead of being followed),
whole files are written to `<name>.partial` and renamed over `<name>`, and a link found at any name the
tuner writes, replaces or removes is refused, naming it. The folders above a results folder are the
user's own path and are taken as they are.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import weakref
from pathlib import Path
from typing import IO

import dsconfig

from .errors import AutotuningError

MARKER = ".dstrain_autotuning"
MARKER_TEXT = "made by dstrain's autotuner; it writes only into folders holding this file\n"
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # NONBLOCK: a planted FIFO never hangs a read


class OwnedDir:
    """An open folder the autotuner made (or took up); `path` is for messages and for child processes."""

    def __init__(self, fd: int, path: Path) -> None:
        self.fd = fd
        self.path = path
        self._finalizer = weakref.finalize(self, os.close, fd)

    def close(self) -> None:
        self._finalizer()

    # ------------------------------------------------------------------ folders
    @classmethod
    def prepare(cls, path: Path, what: str) -> OwnedDir:
        """autotuning.<what> as a folder of the autotuner: made (parents too) where missing, taken up where it
        holds the marker or is empty; anything else is a ConfigError naming the key."""
        key = f"autotuning.{what}"

        def refuse(message: str) -> dsconfig.ConfigError:
            return dsconfig.ConfigError(dsconfig.Problem(key, message, str(path)))

        try:
            made = False
            if not os.path.lexists(path):
                try:
                    try:
                        os.mkdir(path)
                    except FileNotFoundError:  # its parents first (they are the user's path)
                        os.makedirs(path.parent, exist_ok=True)
                        os.mkdir(path)
                    made = True
                except FileExistsError:
                    pass  # made meanwhile: checked below like any other
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                raise refuse(f"is a symbolic link (to {os.readlink(path)!r}); the autotuner writes only into a "
                             f"folder it made: remove the link, or name a new folder (it is created)")
            if not stat.S_ISDIR(st.st_mode):
                raise refuse("is a file; name a directory (it is created)")
            try:
                fd = os.open(path, _DIR)
            except OSError as exc:
                if _is_link_error(exc):
                    raise refuse("was replaced by a symbolic link while it was being opened; it is not "
                                 "followed") from None
                raise
            folder = cls(fd, path)
            problem = folder._claim(made)
            if problem:
                folder.close()
                raise refuse(problem)
            folder._check_writable()
        except OSError as exc:
            raise refuse(f"cannot be created or written ({exc.strerror or exc}); name a directory this user "
                         f"can write (it is created)") from None
        return folder

    def folder(self, name: str) -> OwnedDir:
        """The sub-folder `name` (an experiment's), made here or taken up as `prepare` does; an
        AutotuningError naming it otherwise."""
        _check_name(name)
        path = self.path / name
        made = False
        try:
            os.mkdir(name, dir_fd=self.fd)
            made = True
        except FileExistsError:
            pass
        try:
            fd = os.open(name, _DIR, dir_fd=self.fd)
        except OSError as exc:
            if _is_link_error(exc):
                raise AutotuningError(f"{path} is {self._describe(name)}; the autotuner writes an experiment "
                                      f"only into a folder it made: remove it") from None
            raise AutotuningError(f"cannot open the experiment folder {path}: {exc.strerror or exc}") from None
        folder = OwnedDir(fd, path)
        problem = folder._claim(made)
        if problem:
            folder.close()
            raise AutotuningError(f"{path} {problem}")
        return folder

    def _claim(self, made: bool) -> str | None:
        """Why this folder is not the autotuner's (None: it is, and holds the marker now)."""
        st = os.fstat(self.fd)
        if st.st_uid != os.geteuid():
            return (f"belongs to another user (uid {st.st_uid}); the autotuner writes only into a folder it made: "
                    f"name a new folder (it is created)")
        try:
            marker = os.stat(MARKER, dir_fd=self.fd, follow_symlinks=False)
            if stat.S_ISREG(marker.st_mode):
                return None
            return (f"holds {MARKER} as {_kind(marker.st_mode)}, not the file the autotuner leaves; it was not "
                    f"made by the autotuner: name a new folder (it is created)")
        except FileNotFoundError:
            pass
        if not made and os.listdir(self.fd):
            return (f"was not made by the autotuner (it has no {MARKER} file) and is not empty; the autotuner "
                    f"writes only into folders it made: name a new folder (it is created), or empty this one")
        fd = os.open(MARKER, _NEW, 0o644, dir_fd=self.fd)
        with os.fdopen(fd, "w") as f:
            f.write(MARKER_TEXT)
        return None

    def _check_writable(self) -> None:
        """What access() cannot tell (a read-only mount, root on procfs): create a file and remove it."""
        probe = f".dstrain_write_check.{os.getpid()}"
        self.remove(probe)
        os.close(os.open(probe, _NEW, 0o600, dir_fd=self.fd))
        os.unlink(probe, dir_fd=self.fd)

    # ------------------------------------------------------------------ files
    def write_text(self, name: str, text: str) -> Path:
        """`text` into `name` through `<name>.partial` renamed over it: a reader never sees half of it, and a
        link at either name is refused, not followed."""
        _check_name(name)
        partial = name + ".partial"
        self.remove(partial)  # a regular file left by a killed session
        self._regular_or_missing(name)
        fd = self._create(partial, 0o644)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            self._regular_or_missing(name)  # a link planted meanwhile is refused rather than silently replaced
            os.replace(partial, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(partial, dir_fd=self.fd)
            raise
        return self.path / name

    def create(self, name: str) -> IO[bytes]:
        """A new, empty `name` open for writing (an earlier regular file of that name is removed first)."""
        _check_name(name)
        self.remove(name)
        return os.fdopen(self._create(name, 0o644), "wb")

    def remove(self, name: str) -> None:
        """Remove the regular file `name` if there is one; a link or anything else at that name is refused."""
        _check_name(name)
        if self._regular_or_missing(name):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=self.fd)

    def read_bytes(self, name: str, tail: int | None = None) -> bytes | None:
        """The regular file `name` (its last `tail` bytes), or None when missing, a link or unreadable."""
        try:
            fd = os.open(name, _READ, dir_fd=self.fd)
        except OSError:
            return None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                return None
            if tail is not None:
                f.seek(max(st.st_size - tail, 0))
            return f.read()

    def refuse_links(self, names: tuple[str, ...]) -> None:
        """Fail before any experiment runs when a name the session ends by writing is already a link."""
        for name in names:
            for candidate in (name, name + ".partial"):
                self._regular_or_missing(candidate)

    # ------------------------------------------------------------------ helpers
    def _create(self, name: str, mode: int) -> int:
        try:
            return os.open(name, _NEW, mode, dir_fd=self.fd)
        except FileExistsError:
            raise AutotuningError(f"{self.path / name} appeared while the autotuner was creating it (now "
                                  f"{self._describe(name)}); it is not overwritten: find out what made it") from None

    def _regular_or_missing(self, name: str) -> bool:
        """Whether the regular file `name` exists; an AutotuningError naming it when something else is there."""
        try:
            st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        if not stat.S_ISREG(st.st_mode):
            raise AutotuningError(f"{self.path / name} is {self._describe(name)}; the autotuner writes only "
                                  f"regular files it made there and never follows a link: remove it")
        return True

    def _describe(self, name: str) -> str:
        try:
            st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except OSError:
            return "gone"
        if stat.S_ISLNK(st.st_mode):
            try:
                return f"a symbolic link (to {os.readlink(name, dir_fd=self.fd)!r})"
            except OSError:
                return "a symbolic link"
        return _kind(st.st_mode)


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISREG(mode):
        return "a regular file"
    return "a special file (fifo, socket or device)"


def _is_link_error(exc: OSError) -> bool:
    return exc.errno in (errno.ELOOP, errno.ENOTDIR)


def _check_name(name: str) -> None:
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise AutotuningError(f"{name!r} is not a file name the autotuner writes (one path component)")


def write_file_no_follow(path: str, text: str) -> None:
    """`text` into `path` through a partial file renamed over it, for a process that was handed the path (the
    engine's metrics file): the folder is entered without following a link in its place, and neither file
    name is followed."""
    folder = os.path.dirname(os.path.abspath(path))
    name = os.path.basename(path)
    owned = OwnedDir(os.open(folder, _DIR), Path(folder))
    try:
        owned.write_text(name, text)
    finally:
        owned.close()
