"""One writer per run folder: an exclusive lock taken before anything is written into the folder.

``with RunLock(folder, "mdc train"):`` holds an advisory ``flock`` on ``folder/.mdc.lock`` (run folders, and plan
folders in ``mdc runs``). The kernel grants it to one open file at a time and drops it when its process dies, so a
lock left by a crashed writer is taken over, never waited on. The file records its holder (PID, host, command,
start time), so a second writer fails at once with a one-line :class:`RunFolderBusy` naming it. (``filelock`` locks
the same way but records no holder to name.) POSIX only (``fcntl``). No torch here: the command line takes it.

**No links followed.** The lock file is opened with ``O_NOFOLLOW``, and :func:`refuse_links` (called under the lock,
before the first write) names any symbolic link among what a writer writes (:class:`LinkRefused`, one line).
"""

from __future__ import annotations

import datetime as dt
import errno
import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

LOCK_NAME = ".mdc.lock"


class RunFolderBusy(RuntimeError):
    """Another process holds the folder's lock (it is writing there now)."""


class LinkRefused(ValueError):
    """A symbolic link where a writer writes in the folder it owns: writing through it would change a file elsewhere."""

    @classmethod
    def at(cls, link: str | Path) -> LinkRefused:
        target = os.readlink(link) if os.path.islink(link) else "?"
        return cls(f"{link} is a symbolic link (to {target}): mdc never writes or deletes through a link in a folder "
                   "it writes; remove the link (nothing was written)")


def refuse_links(folder: str | Path, *, depth: int | None = None, skip: tuple[str, ...] = ()) -> None:
    """Raise :class:`LinkRefused` naming the first symbolic link inside `folder`, walked without following links
    (`depth` levels of it, None: all); entries of `folder` itself whose names start with one of `skip` are left
    out (caches with their own containment checks). `folder` itself may be a link (the user's choice of place)."""
    folder = Path(folder)
    for root, dirs, files in os.walk(folder):  # followlinks=False: a link to a folder is listed, never entered
        level = len(Path(root).relative_to(folder).parts)
        for name in sorted(dirs + files):
            if level == 0 and skip and name.startswith(skip):
                continue
            if os.path.islink(os.path.join(root, name)):
                raise LinkRefused.at(os.path.join(root, name))
        if level == 0 and skip:
            dirs[:] = [d for d in dirs if not d.startswith(skip)]
        if depth is not None and level + 1 >= depth:
            dirs.clear()


def describe_holder(record: dict[str, Any]) -> str:
    """'pid 123 (`mdc train`, started 2025-01-01 12:00:00 on host)' from a lock file's record."""
    pid = record.get("pid", "?")
    mine = " (this process)" if pid == os.getpid() and record.get("host") == socket.gethostname() else ""
    what = f"`{record['command']}`, " if record.get("command") else ""
    when = f"started {record['started']}" if record.get("started") else "starting"
    host = f" on {record['host']}" if record.get("host") and record.get("host") != socket.gethostname() else ""
    return f"pid {pid}{mine} ({what}{when}{host})"


def _read_record(fd: int) -> dict[str, Any]:
    try:
        text = os.pread(fd, 4096, 0).decode("utf-8", errors="replace")
        record = json.loads(text) if text.strip() else {}
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


class RunLock:
    """An exclusive, crash-safe lock on the run (or plan) folder `folder`, created if missing (see the module
    docstring); a second writer is shown `command`, what the holder is doing (e.g. ``"mdc train"``)."""

    def __init__(self, folder: str | Path, command: str = ""):
        self.folder, self.command = Path(folder), command
        self.path = self.folder / LOCK_NAME
        self.previous: dict[str, Any] = {}  # the record a crashed holder left, if any (its lock was free)
        self._fd: int | None = None
        self._shared: list[int] = []  # shared locks on the folders the holder reads (:meth:`share`)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> RunLock:
        """Take the lock, or raise :class:`RunFolderBusy` naming the process that holds it."""
        if self._fd is not None:
            return self
        if self.folder.exists() and not self.folder.is_dir():
            raise NotADirectoryError(f"{self.folder} is a file, not a folder (nothing was written)")
        self.folder.mkdir(parents=True, exist_ok=True)
        if self.path.is_dir():
            raise IsADirectoryError(f"{self.path} is a folder, not the lock file mdc keeps there: remove or rename it "
                                    "(nothing was written)")
        while True:
            try:  # never through a link: that would truncate the file it points to
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
            except OSError as err:
                if err.errno == errno.ELOOP:
                    raise LinkRefused.at(self.path) from None
                raise
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                record = _read_record(fd)
                if not record:  # the holder may be writing its record at this instant
                    time.sleep(0.2)
                    record = _read_record(fd)
                os.close(fd)
                raise RunFolderBusy(f"{self.folder} is in use by another writer, {describe_holder(record)}; wait for "
                                    f"it to finish or stop it (a crashed writer's lock is freed by the system, so "
                                    f"this one is running)") from None
            if self._same_file(fd):
                break
            os.close(fd)  # the holder released (and removed) the file between our open and flock: try again
        self.previous = _read_record(fd)
        record = {"pid": os.getpid(), "host": socket.gethostname(), "command": self.command or Path(sys.argv[0]).name,
                  "started": dt.datetime.now().isoformat(sep=" ", timespec="seconds")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
        self._fd = fd
        return self

    def _same_file(self, fd: int) -> bool:
        try:
            a, b = os.fstat(fd), os.lstat(self.path)
        except FileNotFoundError:
            return False
        return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)

    def share(self, folder: str | Path) -> None:
        """Hold a shared ``flock`` on the folder `folder` (a data set the holder reads) until :meth:`release`: a
        writer that replaces data sets (``mdc data synth --overwrite``: an exclusive lock) refuses it meanwhile,
        and one at work there makes this raise :class:`RunFolderBusy`. Nothing is written into `folder`."""
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunFolderBusy(f"{folder} is being rewritten (`mdc data synth --overwrite` holds it): wait for it to "
                                "finish, then train (nothing was written)") from None
        self._shared.append(fd)

    def release(self) -> None:
        """Remove the lock file and drop the lock (nothing happens when it is not held)."""
        while self._shared:
            os.close(self._shared.pop())
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            if self._same_file(fd):  # removed while held only by a cleanup of the whole folder
                self.path.unlink()
        finally:
            os.close(fd)  # closing drops the flock

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

