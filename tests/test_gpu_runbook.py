"""bench/gpu_runbook.py --smoke: every step of the GPU runbook, tiny, on CPU, writes its JSON (issue 19)."""
import json, os, subprocess, sys
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("PALT_DATA") or ROOT.parent / "shared" / "data")


@pytest.mark.skipif(not (DATA / "umls").is_dir(), reason="needs the umls data ($PALT_DATA or ../shared/data)")
def test_the_smoke_run_does_every_step_and_writes_json(tmp_path):
    env = dict(os.environ, PALT_DATA=str(DATA))
    p = subprocess.run([sys.executable, "bench/gpu_runbook.py", "--smoke", "--out", str(tmp_path)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    report = json.loads((tmp_path / "runbook.json").read_text())
    assert report["smoke"] and report["tests"]["returncode"] == 0 and "passed" in report["tests"]["summary"]
    [row] = [r for r in report["throughput"]["rows"] if r["dtype"] == "fp32"]  # (bf16 too, where the CPU has it)
    assert row["triples"] == 256 and row["triples_per_s"] > 0 and 0 < row["share_of_matmul_peak"] < 2
    [ranked] = report["rank"]
    assert ranked["returncode"] == 0, ranked
    result = json.loads((tmp_path / "rank-umls.json").read_text())
    assert result["counts"]["ranked_triples"] == 2 and result["ckpt"] == "weights/palt-umls-minilm.safetensors"
