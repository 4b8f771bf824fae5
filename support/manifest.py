"""A result's manifest: what it takes to tell where a figure came from and to run it again (the
code's commit and whether the tree had changes, the library versions, the device and threads, the
data files' checksums, the exact argv). Every result JSON carries one under "manifest"."""
import hashlib
import importlib.metadata
import platform
import subprocess
from collections.abc import Iterable
from pathlib import Path

import torch

from support import devices, files

LIBRARIES = ("torch", "numpy", "tokenizers", "safetensors")
# The CPU flags that decide the precision and speed of a run (support/devices.py).
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
UNRECORDED = "unrecorded"  # what an old result's manifest says of what it did not record


def git_state(root: Path = files.ROOT) -> tuple[str, bool | str]:
    """(commit, dirty): HEAD's hash and whether tracked files differ from it; UNRECORDED for both
    outside a git checkout (an unpacked archive) or without git."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                                text=True, timeout=30, check=True).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                cwd=root, capture_output=True, text=True, timeout=30,
                                check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return UNRECORDED, UNRECORDED
    return commit, bool(status.strip())


def versions() -> dict[str, str]:
    """Python's version and each of LIBRARIES' as installed ('not installed' where it is not)."""
    out = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    out["torch"] = torch.__version__  # the build (+cpu, +cu130) as torch reports it
    return out


def device_record(device: str | torch.device = "cpu", cpuinfo: str = "/proc/cpuinfo") -> dict:
    """The device a result ran on: a GPU's name, or the CPU's model name, family, model and which of
    CPU_FLAGS it has; the threads torch uses either way."""
    device = torch.device(device)
    record = {"threads": torch.get_num_threads()}
    if device.type == "cuda":
        return {"gpu": torch.cuda.get_device_name(device), **record}
    fields = devices.cpu_fields(cpuinfo)
    have = set(fields.get("flags", "").split())
    return {"cpu": fields.get("model name", "unknown CPU"), "family": fields.get("cpu family", "?"),
            "model": fields.get("model", "?"), "flags": [f for f in CPU_FLAGS if f in have],
            **record}


def sha256(path: Path) -> str:
    """A file's SHA-256, read in chunks (a big graph's train file is tens of MB)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def manifest(argv: list[str], data_files: Iterable[Path] = (),
             device: str | torch.device = "cpu") -> dict:
    """The manifest of a result: commit, dirty, versions, device, the data files' SHA-256 by name
    (the graph's folder and the file: `umls/train.tsv`, the same on every machine), and argv as
    given."""
    commit, dirty = git_state()
    data = {}
    for path in map(Path, data_files):
        if path.is_file():
            data[f"{path.parent.name}/{path.name}"] = sha256(path)
    return {"commit": commit, "dirty": dirty, "versions": versions(),
            "device": device_record(device), "data_sha256": data, "argv": list(argv)}
