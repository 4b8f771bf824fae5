"""support/manifest.py: a result JSON's manifest records the commit, the versions, the device, the data files'
checksums and the argv; evaluate.py's results JSON carries it."""
import hashlib, json, re, subprocess

import torch

from support import files, manifest


def test_the_manifest_records_commit_versions_device_data_and_argv(tmp_path):
    kg = tmp_path / "mygraph"
    kg.mkdir()
    (kg / "train.tsv").write_text("a\tr\tb\n")
    m = manifest.manifest(argv=["evaluate.py", "--lp"], data_files=[kg / "train.tsv", kg / "absent.txt"])
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=files.ROOT, capture_output=True, text=True).stdout.strip()
    assert m["commit"] == head and isinstance(m["dirty"], bool)
    assert m["versions"]["torch"] == torch.__version__ and re.fullmatch(r"\d+\.\d+\.\d+.*", m["versions"]["python"])
    assert set(m["versions"]) == {"python", "torch", "numpy", "tokenizers", "safetensors"}
    assert m["device"]["threads"] == torch.get_num_threads() and m["device"]["cpu"]
    assert m["data_sha256"] == {"mygraph/train.tsv": hashlib.sha256(b"a\tr\tb\n").hexdigest()}  # the absent one: none
    assert m["argv"] == ["evaluate.py", "--lp"] and json.loads(json.dumps(m)) == m


def test_the_cpu_flags_that_matter_are_named(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("model name\t: Some CPU\ncpu family\t: 25\nmodel\t\t: 17\nflags\t\t: fpu avx2 avx512f avx512_bf16\n")
    d = manifest.device_record("cpu", cpuinfo=str(info))
    assert (d["cpu"], d["family"], d["model"], d["flags"]) == ("Some CPU", "25", "17", ["avx2", "avx512f", "avx512_bf16"])


def test_outside_a_git_checkout_commit_and_dirty_are_unrecorded(tmp_path):
    assert manifest.git_state(tmp_path) == (manifest.UNRECORDED, manifest.UNRECORDED)
