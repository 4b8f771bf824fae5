"""Downloads, kept out of the model-reading path: base models from the Hugging Face hub (into weights/, or
$PALT_WEIGHTS) and the benchmarks from KG-BERT's repository (checked against data.sha256). Every file is fetched
into a .part file that a rerun resumes, checked for size and sha256, then renamed into place atomically.
Tests point PALT_HUB_URL / PALT_DATA_URL at a local server; bert.py and data.py call in, never the reverse.
"""
import hashlib, os, re, sys, urllib.error, urllib.request
from pathlib import Path

WEIGHTS = Path(os.environ.get("PALT_WEIGHTS", Path(__file__).parent / "weights"))  # downloaded base models
HUB = os.environ.get("PALT_HUB_URL", "https://huggingface.co")
HUB_MODELS = {name: f"google-bert/{name}" for name in ("bert-base-cased", "bert-base-uncased", "bert-large-cased",
                                                       "bert-large-uncased")}
HUB_FILES = ("config.json", "tokenizer_config.json", "vocab.txt", "model.safetensors")
KGBERT_URL = "https://raw.githubusercontent.com/yao8839836/kg-bert/master/data"
SHA256SUMS = Path(__file__).with_name("data.sha256")  # KG-BERT's files, as `sha256sum -c` reads them


class DownloadError(ValueError):
    """A download that failed or did not check out: one line naming the URL, and where to put the files instead."""


def sha256_file(path):
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def download(url, dest, sha256=None, size=None):
    """Fetch url to dest: resumes a partial dest.part, checks size and sha256, then renames atomically."""
    dest, part = Path(dest), Path(str(dest) + ".part")
    dest.parent.mkdir(parents=True, exist_ok=True)
    have = part.stat().st_size if part.exists() else 0
    if size is None or have < size:  # (a complete .part was only waiting for its check and rename)
        req = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
        with urllib.request.urlopen(req, timeout=60) as r:
            if have and r.status != 206:  # the server ignored the range: start again
                have = 0
            with open(part, "ab" if have else "wb") as f:
                while chunk := r.read(1 << 20):
                    f.write(chunk)
    got, digest = part.stat().st_size, sha256_file(part)
    wrong = (f"size {got} is not the expected {size}" if size is not None and got != size else
             f"sha256 {digest} is not the expected {sha256}" if sha256 is not None and digest != sha256 else None)
    if wrong:
        part.unlink()
        raise DownloadError(f"{url}: {wrong}; nothing written")
    os.replace(part, dest)


def hub_checks(url):
    """(size, sha256) that the hub announces for a file: X-Linked-* for large (LFS) files, else Content-Length."""
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args):
            return None
    try:
        r = urllib.request.build_opener(NoRedirect).open(urllib.request.Request(url, method="HEAD"), timeout=30)
    except urllib.error.HTTPError as e:
        if e.code not in (301, 302, 303, 307, 308):
            raise
        r = e  # a redirect to the storage server still carries the hub's headers
    etag = (r.headers.get("X-Linked-Etag") or r.headers.get("ETag") or "").strip('"').removeprefix("W/").strip('"')
    size = r.headers.get("X-Linked-Size") or r.headers.get("Content-Length")
    return (int(size) if size else None), (etag if re.fullmatch(r"[0-9a-f]{64}", etag) else None)


def model(name):
    """WEIGHTS/name, the files that are not there yet downloaded from the hub and checked."""
    target = WEIGHTS / name
    if (target / "model.safetensors").is_file():
        return target
    try:
        for file in HUB_FILES:
            url = f"{HUB}/{HUB_MODELS[name]}/resolve/main/{file}"
            if not (target / file).is_file():
                print(f"downloading {url}", file=sys.stderr)
                size, sha256 = hub_checks(url)
                download(url, target / file, sha256, size)
    except (urllib.error.URLError, OSError) as e:
        raise DownloadError(f"{name}: cannot download ({getattr(e, 'reason', e)}); put {', '.join(HUB_FILES)} "
                            f"from the hub's {HUB_MODELS[name]} into {target}/") from None
    return target


def checksums():
    """{folder: {file: sha256}} from data.sha256 (`cd $PALT_DATA && sha256sum -c .../data.sha256` checks a copy)."""
    sums = {}
    for line in SHA256SUMS.read_text().splitlines():
        sha, path = line.split()
        folder, file = path.split("/")
        sums.setdefault(folder, {})[file] = sha
    return sums


def benchmark(folder, target, base_url=None, sums=None):
    """KG-BERT's data/<folder> into target, each file checked against its sha256 (files already right are kept)."""
    base = (base_url or os.environ.get("PALT_DATA_URL") or KGBERT_URL).rstrip("/")
    files = (sums or checksums())[folder]
    for file, want in files.items():
        dest, url = Path(target) / file, f"{base}/{folder}/{file}"
        if dest.is_file() and sha256_file(dest) == want:
            continue
        try:
            download(url, dest, sha256=want)
        except urllib.error.HTTPError as e:
            raise DownloadError(f"{url}: HTTP {e.code} {e.reason}") from None
        except (urllib.error.URLError, OSError) as e:
            raise DownloadError(f"{url}: cannot download ({getattr(e, 'reason', e)}); put {', '.join(files)} from "
                                f"KG-BERT's data/{folder}/ into {target}/ (or point --data-dir / PALT_DATA at them)") from None
        print(f"{dest}  ok", file=sys.stderr)
    return Path(target)
