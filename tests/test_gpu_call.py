"""bench/gpu_call.py: how one GPU call's training shares its budget, and --smoke: every step of the call, tiny, on
CPU, with the flags a GPU call runs."""
import argparse, json, os, subprocess, sys, tarfile
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("PALT_DATA") or ROOT.parent / "shared" / "data")


@pytest.mark.slow  # ~12 minutes: --recipe gpu compiles on the CPU (torch.compile), twice; the graphs' tests
@pytest.mark.skipif(not (DATA / "umls").is_dir(), reason="needs the umls data ($PALT_DATA or ../shared/data)")
def test_the_smoke_run_does_every_step_and_writes_json(tmp_path):
    env = dict(os.environ, PALT_DATA=str(DATA))
    p = subprocess.run([sys.executable, "bench/gpu_call.py", "--smoke", "--out", str(tmp_path / "out"), "--work",
                        str(tmp_path / "work")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    assert p.returncode == 0, p.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "gpu_call.json").read_text())
    pytest_run, ddp_train, ddp_rank = report["tests"]
    assert report["smoke"] and pytest_run["returncode"] == 0 and "passed" in pytest_run["summary"]
    assert "--device cpu" in pytest_run["command"] and ddp_train["returncode"] == ddp_rank["returncode"] == 0
    bench_train, graphs = report["speed"]  # the step's recipe rows and the attention table (the whole output), then
    assert graphs["cudagraphs"] and graphs["tests_returncode"] == 0, graphs  # the graphs' tests decide (--smoke)
    assert bench_train["returncode"] == 0 and "\ncpu " in bench_train["output"], report["speed"]
    recipes = bench_train["output"].split("attention:")[0]  # the recipe table, before the attention one
    rows = [line.split() for line in recipes.splitlines() if line.split()[1:2] in (["32"], ["64"])]
    assert [r[:3] for r in rows] == [["cpu", "32", "128"], ["cpu@64", "64", "256"]], rows  # RECIPE@N: at batch N
    attention = bench_train["output"].split("attention: one layer's forward + backward")[1].splitlines()
    assert attention[2].split()[0] == "32" and attention[2].split()[4] != "-", attention  # the math kernel: timed
    [train] = report["train"]  # the call's run: --recipe gpu --cudagraphs (on a CPU: compiled), stopped by its step
    assert train["returncode"] == 0 and train["finished"] and train["rank"]["returncode"] == 0, train  # limit, ranked
    assert "--cudagraphs" in train["command"], train["command"]
    assert "umls-gpu/state.safetensors" in tarfile.open(tmp_path / "out" / "train-umls.tar").getnames()
    assert {r["recipe"] for r in report["throughput"]["train_rows"]} == {"cpu", "cpu:compile", "gpu"}  # no CUDA graphs
    [row] = [r for r in report["throughput"]["rows"] if r["dtype"] == "fp32"]  # (bf16 too, where the CPU has it)
    assert row["triples"] == 256 and row["triples_per_s"] > 0 and 0 < row["share_of_matmul_peak"] < 2
    [ranked] = report["rank"]
    assert ranked["returncode"] == 0, ranked
    result = json.loads((tmp_path / "out" / "rank-umls.json").read_text())
    assert result["counts"]["ranked_triples"] == 2 and result["ckpt"] == "weights/palt-umls-minilm.safetensors"


def gpu_call(tmp_path, monkeypatch, run_for):
    """bench/gpu_call.py with no committed runs (ROOT is tmp_path) and run_for faked; a call's train-step arguments."""
    sys.path.insert(0, str(ROOT / "bench"))
    import gpu_call
    monkeypatch.setattr(gpu_call, "ROOT", tmp_path)
    monkeypatch.setattr(gpu_call, "run_for", run_for)
    return gpu_call, argparse.Namespace(graphs=["wn18rr", "fb15k-237"], work=str(tmp_path / "work"),
                                           out=str(tmp_path), data_dir="d", smoke=False, rank_limit=5)


def test_a_call_trains_the_graphs_in_turn_the_first_with_the_whole_training_budget(tmp_path, monkeypatch):
    asked = []  # (graph, seconds given); each fake run returns at once, as if stopped
    rb, args = gpu_call(tmp_path, monkeypatch, lambda cmd, seconds: asked.append((cmd[3], seconds)) or (None, "stopped"))
    rows = rb.train_runs(args, lambda: 600.0)  # 600 s left: 120 kept for the tars and the rank step
    assert [name for name, _ in asked] == ["wn18rr", "fb15k-237"] and 479 < asked[0][1] <= 480, asked
    assert [r["returncode"] for r in rows] == [None, None] and not any(r["finished"] for r in rows)


def test_a_call_without_a_minute_to_train_skips_each_graph_and_starts_nothing(tmp_path, monkeypatch):
    rb, args = gpu_call(tmp_path, monkeypatch, lambda *a: pytest.fail("started a run without the time for it"))
    rows = rb.train_runs(args, lambda: 170.0)  # 50 s after the 120 kept
    assert [r.get("skipped") for r in rows] == ["no time left in the call's budget"] * 2
    assert not (tmp_path / "work").exists() and not list(tmp_path.glob("*.tar"))


def test_a_run_trained_and_ranked_in_an_earlier_call_gives_its_time_to_the_next(tmp_path, monkeypatch):
    asked = []
    rb, args = gpu_call(tmp_path, monkeypatch, lambda cmd, seconds: asked.append((cmd[3], seconds)) or (None, "stopped"))
    (tmp_path / "work" / "wn18rr-gpu").mkdir(parents=True)
    (tmp_path / "work" / "wn18rr-gpu" / "rank.json").write_text(json.dumps({"counts": {"ranked_triples": 5}}))
    rows = rb.train_runs(args, lambda: 600.0)
    assert [name for name, _ in asked] == ["fb15k-237"] and 479 < asked[0][1] <= 480, asked
    assert rows[0]["skipped"] == "trained and 5 test triples ranked" and rows[1]["returncode"] is None


def test_a_run_ranked_short_of_the_limit_is_ranked_further_without_training(tmp_path, monkeypatch):
    """A committed run with a rank.json is trained (rank.json is written after the training): a larger --rank-limit
    starts evaluate.py only, so a finished run's folder needs no state.safetensors (train.py would refuse it)."""
    asked = []
    rb, args = gpu_call(tmp_path, monkeypatch, lambda cmd, seconds: asked.append(cmd[1:4]) or (None, "stopped"))
    (tmp_path / "results" / "gpu" / "wn18rr-gpu").mkdir(parents=True)  # no state.safetensors: only ranks
    rank = tmp_path / "results" / "gpu" / "wn18rr-gpu" / "rank.json"
    rank.write_text(json.dumps({"counts": {"ranked_triples": 3}}))
    rows = rb.train_runs(args, lambda: 600.0)
    assert asked[0] == ["evaluate.py", "--lp", "--data"] and asked[1][0] == "train.py", asked  # then fb15k-237 trains
    assert rows[0]["finished"] and rows[0]["rank"]["returncode"] is None


def test_the_rank_step_skips_an_adapter_whose_committed_ranks_hold_the_asked_triples(tmp_path, monkeypatch):
    """A shipped adapter whose committed ranks (state and JSON) already hold --rank-limit triples starts no
    evaluate.py (its load and compile would cost a GPU call ~15 s for nothing); one short of them is ranked, from its
    committed state. (An adapter without a state, such as UMLS's full ranking, is ranked afresh: the smoke run.)"""
    asked = []
    rb, args = gpu_call(tmp_path, monkeypatch, lambda cmd, seconds: asked.append(cmd) or (0, "ranked"))
    for name, ranked in (("wn18rr", 5), ("fb15k-237", 4)):
        (tmp_path / "weights").mkdir(exist_ok=True)
        (tmp_path / "weights" / f"palt-{name}-minilm.safetensors").write_bytes(b"adapter")
        (tmp_path / "results" / f"palt-{name}-minilm.state").mkdir(parents=True)
        result = tmp_path / "results" / f"palt-{name}-minilm.json"
        result.write_text(json.dumps({"counts": {"ranked_triples": ranked}}))
    rows = rb.rank(args, lambda: 600.0)
    assert rows[0] == {"data": "wn18rr", "skipped": "5 test triples already ranked (palt-wn18rr-minilm.json)"}
    assert [cmd[cmd.index("--data") + 1] for cmd in asked] == ["fb15k-237"] and rows[1]["returncode"] == 0
    assert (tmp_path / "rank-fb15k-237.state").is_dir()  # the committed state, copied to continue from


@pytest.mark.parametrize("graphs_row, tests_pass, chosen", [(30000, True, True), (21000, True, False),
                                                            (30000, False, False), (None, True, False)])
def test_the_speed_step_gives_the_training_cuda_graphs_only_where_they_pay_and_pass_their_tests(
        tmp_path, monkeypatch, graphs_row, tests_pass, chosen):
    """gpu:cudagraphs at >= 1.15x gpu (20,000 seq/s here) and its tests passing on the device: the decision the
    training reads. Below the gain, or with the row missing (the bench stopped before it), no test starts."""
    rows = "recipe  batch\ngpu                   32      160  compile   20,000   1,000,000\n" + (
        f"gpu:cudagraphs        32      160 cudagraphs {graphs_row:,}   1,500,000\n" if graphs_row else "")
    asked = []

    def run_for(cmd, seconds):
        asked.append(cmd)
        if "bench/bench_train.py" in cmd:
            return 0, rows + "\nattention: one layer's forward + backward\n 48  gpu:cudagraphs 1 2 3 99,999\n"
        return (0, "3 passed") if tests_pass else (1, "1 failed, 2 passed")

    rb, args = gpu_call(tmp_path, monkeypatch, run_for)
    bench, decision = rb.speed(args, lambda: 600.0)
    assert decision["cudagraphs"] is chosen and decision["rates"]["gpu"] == 20000
    assert json.loads((tmp_path / "work" / "cudagraphs.json").read_text())["cudagraphs"] is chosen
    assert len(asked) == (2 if graphs_row == 30000 else 1), asked  # the tests run only for a row that pays
    if len(asked) == 2:
        assert asked[1][asked[1].index("--device") + 1:] == ["cuda", "tests/test_train.py", "-k",
                                                             "cudagraphs or dropout_in_the_compiled"], asked[1]


def test_the_call_trains_with_cuda_graphs_when_chosen_and_without_them_after_a_crash(tmp_path, monkeypatch):
    """The speed step's cudagraphs.json adds --cudagraphs; a step that dies (a traceback) resumes without graphs,
    and if that dies too, eager (--no-compile); a run stopped at the budget is not retried."""
    asked = []
    crash = (1, "Traceback (most recent call last):\n  ...\nRuntimeError: CUDA error")

    def run_for(cmd, seconds):
        asked.append(cmd)
        return crash if cmd[3] == "wn18rr" else (None, "stopped")

    rb, args = gpu_call(tmp_path, monkeypatch, run_for)
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "cudagraphs.json").write_text(json.dumps({"cudagraphs": True}))
    rows = rb.train_runs(args, lambda: 600.0)
    flags = [(cmd[3], "--cudagraphs" in cmd, "--no-compile" in cmd) for cmd in asked]
    assert flags == [("wn18rr", True, False), ("wn18rr", False, False), ("wn18rr", False, True),
                     ("fb15k-237", True, False)], flags
    assert rows[0]["returncode"] == 1 and "--no-compile" in rows[0]["command"] and rows[1]["returncode"] is None


def test_the_methods_step_runs_the_searches_then_the_finals_and_brings_back_what_they_wrote(tmp_path, monkeypatch):
    """Searches first; the finals only once the searches have ended (exit 0); a part stopped at the budget ends the
    step; methods.tar holds the studies, the finals and the logs, by their paths in the repository."""
    asked = []
    codes = iter([0, None])  # the searches end; the UMLS finals are stopped at the budget
    rb, args = gpu_call(tmp_path, monkeypatch, lambda cmd, seconds, env=None: asked.append(
        (cmd[2:], seconds, env["OMP_NUM_THREADS"])) or (next(codes), "out"))
    args.jobs = 10
    (tmp_path / "results" / "tune-umls-lora").mkdir(parents=True)
    (tmp_path / "results" / "tune-umls-lora" / "study.db").write_text("study")
    (tmp_path / "results" / "methods" / "umls-palt-s42.state").mkdir(parents=True)
    (tmp_path / "results" / "methods" / "umls-palt-s42.json").write_text("{}")
    (tmp_path / "results" / "tune-umls-palt").mkdir()  # not one of the comparison's searches: stays behind
    (tmp_path / "runs" / "umls-palt-s42").mkdir(parents=True)
    (tmp_path / "runs" / "umls-palt-s42" / "log.txt").write_text("log")
    (tmp_path / "runs" / "umls-palt-s42" / "state.safetensors").write_text("weights")
    (tmp_path / "runs" / "tune-umls-lora.log").write_text("log")
    rows = rb.methods(args, lambda: 600.0)
    assert [a[0] for a in asked] == [["searches", "--jobs", "10"], ["methods", "--graph", "umls", "--jobs", "10"]]
    assert asked[0][1] == 510 and asked[0][2] == "1"  # 90 s kept to stop and pack; one thread a process
    assert [r["returncode"] for r in rows] == [0, None]  # WN11 and table4 not started
    names = set(tarfile.open(tmp_path / "methods.tar").getnames())
    assert {"results/tune-umls-lora/study.db", "results/methods/umls-palt-s42.json",
            "results/methods/umls-palt-s42.state", "runs/tune-umls-lora.log", "runs/umls-palt-s42/log.txt"} <= names
    assert not any("tune-umls-palt" in n or n.endswith(".safetensors") for n in names)
