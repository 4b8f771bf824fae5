"""Files, the ground floor every other module stands on: reading and writing them safely (one-line
errors, atomic writes) and naming them relative to the project. Imports nothing of the project."""
import hashlib, os, tempfile
from pathlib import Path

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
        raise SystemExit(f"error: {what}: {folder} is not a folder")
    try:
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as e:
        raise SystemExit(f"error: {what}: cannot write in {folder} ({e.strerror or e})") from None


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
