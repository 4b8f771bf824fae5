"""Files, the ground floor every other module stands on: reading and writing them safely (one-line
errors, atomic writes) and naming them relative to the project. Imports only support.errors of the
project."""
import fcntl
import hashlib
import os
import socket
import tempfile
import time
from pathlib import Path

from support.errors import OutputError

# the project: shipped adapters in ROOT/weights, paths in results relative to it
ROOT = Path(__file__).resolve().parents[1]


def readable(path, error=OSError):
    """str(path) once open() works on it, else `error` in one line: safetensors and tokenizers
    report every failed open as "not found", but a file without read permission is not missing."""
    try:
        open(path, "rb").close()
    except OSError as e:  # a folder counts as missing
        why = "no such file"
        if isinstance(e, PermissionError):
            why = "cannot read it (permission denied)"
        raise error(f"{path}: {why}") from None
    return str(path)


def read_text(path, error=OSError):
    """(bytes, text) of a UTF-8 file (a BOM dropped), else `error` in one line naming the file and
    the line."""
    raw = Path(readable(path, error)).read_bytes()
    try:
        return raw, raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise error(f"{path}:{line}: not UTF-8") from None


def write_atomic(path, write):
    """write(f) into path.tmp, then rename it over path: a kill, or a disk that fills, keeps the
    previous file. An OSError (disk full, permissions) comes out after the .tmp is removed."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def check_writable(folder, what):
    """Fail now, in one line, not after hours of work: files must be creatable in `folder`, or in
    the nearest existing folder above it (folders are made only when something is written)."""
    folder = Path(folder)
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        raise OutputError(f"{what}: {folder} is not a folder")
    try:
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as e:
        raise OutputError(f"{what}: cannot write in {folder} ({e.strerror or e})") from None


HELD = {}  # folder -> its lock file, held open by this process (until release_folder)


def lock_folder(folder, what, instead):
    """Hold folder/.lock (an exclusive flock) until this process ends: a second process that asks
    for the same folder is refused in one line naming the holder. The kernel frees a flock when its
    process ends, however it ends (kill -9, a crash, a power cut), so a stale lock never blocks."""
    folder = Path(folder).resolve()
    if folder in HELD:  # this process's already: a run resumed in the same Python process
        return
    folder.mkdir(parents=True, exist_ok=True)
    f = open(folder / ".lock", "a+")
    refuse_if_held(f, folder, what, instead, fcntl.LOCK_EX)
    f.seek(0)
    f.truncate()
    since = time.strftime("%Y-%m-%d %H:%M:%S")
    f.write(f"process {os.getpid()} on {socket.gethostname()} (since {since})\n")
    f.flush()
    HELD[folder] = f


def check_unlocked(folder, what, instead):
    """lock_folder's refusal, asked before any work and writing nothing: is another process
    holding folder/.lock now?"""
    folder = Path(folder).resolve()
    if folder in HELD or not (folder / ".lock").is_file():
        return
    with open(folder / ".lock") as f:
        refuse_if_held(f, folder, what, instead, fcntl.LOCK_SH)
        fcntl.flock(f, fcntl.LOCK_UN)


def refuse_if_held(f, folder, what, instead, mode):
    """flock(f, mode) without waiting; where another process holds it, close f and end in one line
    naming the holder (the lock file's text)."""
    try:
        fcntl.flock(f, mode | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        raise OutputError(f"{folder} ({what}) is in use by {holder}: wait for it to end, "
                          f"or {instead}") from None


def release_folder(folder):
    """Let go of lock_folder's lock (the file stays: removing it could race a new holder)."""
    f = HELD.pop(Path(folder).resolve(), None)
    if f is not None:
        f.close()


def project_path(path):
    """How results name a file: relative to the project where it lies inside it, else absolute (a
    relative path would read as one inside the project, or depend on where the command ran)."""
    p = Path(path).resolve()
    return str(p.relative_to(ROOT) if p.is_relative_to(ROOT) else p)


def in_project(name):
    """A path as project_path records it, back to one that opens from any folder (a relative one
    lies inside the project); a name that is no such path (a benchmark, a model's name) as it is."""
    p = ROOT / name
    return str(p) if not Path(name).is_absolute() and p.exists() else name


def sha256_file(path):
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
