"""bench/gpu_runbook.py --smoke: every step of the GPU run book, tiny, on CPU, with the flags a lease runs (issues 19, 41)."""
import json, os, subprocess, sys, tarfile
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("PALT_DATA") or ROOT.parent / "shared" / "data")


@pytest.mark.slow  # ~10 minutes: --recipe gpu compiles on the CPU (torch.compile), twice
@pytest.mark.skipif(not (DATA / "umls").is_dir(), reason="needs the umls data ($PALT_DATA or ../shared/data)")
def test_the_smoke_run_does_every_step_and_writes_json(tmp_path):
    env = dict(os.environ, PALT_DATA=str(DATA))
    p = subprocess.run([sys.executable, "bench/gpu_runbook.py", "--smoke", "--out", str(tmp_path / "out"), "--work",
                        str(tmp_path / "work")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    assert p.returncode == 0, p.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "runbook.json").read_text())
    pytest_run, ddp_train, ddp_rank = report["tests"]
    assert report["smoke"] and pytest_run["returncode"] == 0 and "passed" in pytest_run["summary"]
    assert "--device cpu" in pytest_run["command"] and ddp_train["returncode"] == ddp_rank["returncode"] == 0
    bench_train, bench_eval = report["speed"]  # the step's recipe rows, the loop against the scorer: whole outputs
    assert bench_train["returncode"] == bench_eval["returncode"] == 0, report["speed"]
    assert "\ncpu " in bench_train["output"] and "the ranking loop's share of the scorer" in bench_eval["output"]
    [train] = report["train"]  # the lease's run: --recipe gpu (compiled), stopped by its step limit, then ranked
    assert train["returncode"] == 0 and train["finished"] and train["rank"]["returncode"] == 0, train
    assert "umls-gpu/state.safetensors" in tarfile.open(tmp_path / "out" / "train-umls.tar").getnames()
    assert {r["recipe"] for r in report["throughput"]["train_rows"]} == {"cpu", "cpu:compile", "gpu"}  # no CUDA graphs
    [row] = [r for r in report["throughput"]["rows"] if r["dtype"] == "fp32"]  # (bf16 too, where the CPU has it)
    assert row["triples"] == 256 and row["triples_per_s"] > 0 and 0 < row["share_of_matmul_peak"] < 2
    [ranked] = report["rank"]
    assert ranked["returncode"] == 0, ranked
    result = json.loads((tmp_path / "out" / "rank-umls.json").read_text())
    assert result["counts"]["ranked_triples"] == 2 and result["ckpt"] == "weights/palt-umls-minilm.safetensors"
