"""support.tune, the search of train.py's recipes on Optuna, on tests/example_kg and a tiny BERT: a search writes its
study, its table and the best trial's train.py line; a search killed with SIGKILL resumes with the same command, its
finished trials kept, its running one trained again with the same settings, no train.py left behind; a trial behind
the median at its first dev point is pruned there, unless that point is its last; a bad --space, a folder in use, another search's folder are refused
in one line."""
import contextlib, io, os, re, shlex, subprocess, sys, time
from pathlib import Path
import pytest

import train
from support import devices, graphs, tune
from conftest import make_bert_dir

optuna = pytest.importorskip("optuna")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = "tests/example_kg"  # 94 train triples: a step of 32 positives, two steps an epoch
CHEAP = "batch=32,negatives=1,1,1"


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    """A tiny random BERT whose vocabulary holds the words of tests/example_kg's entities and relations."""
    kg = graphs.load_kg(ROOT / EXAMPLE)
    words = {w.lower() for text in (*kg.ent_text, *kg.rel_text) for w in text.split()}
    return make_bert_dir(tmp_path_factory.mktemp("tune") / "bert", sorted(words))


def command(bert_dir, out, *extra, space=CHEAP, trials=3):
    """support.tune's flags: one-epoch trials on tests/example_kg, each train.py in fp32."""
    return ["--data", EXAMPLE, "--model", str(bert_dir), "--out", str(out), "--trials", str(trials), "--max-epochs", "1",
            "--space", space, *extra, "--", "--dtype", "fp32"]


def main(argv):
    """tune.main in this process, as `python -m support.tune ARGV` runs it: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = tune.main(argv)
    return status, out.getvalue(), err.getvalue()


def study_of(out):
    return optuna.load_study(study_name="tune", storage=f"sqlite:///{out / 'study.db'}")


def table(out):
    lines = (out / "trials.tsv").read_text().splitlines()
    header = lines[0].split("\t")
    return [dict(zip(header, line.split("\t"))) for line in lines[1:]]


def running(pid):
    """Whether process pid runs (a zombie, ended but not reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_until(check, what, proc, timeout=300):
    """check()'s first true value, polled while the search runs."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = check()
        if got:
            return got
        assert proc.poll() is None, f"the search ended before {what}: {proc.communicate()[1][-3000:]}"
        time.sleep(0.05)
    raise AssertionError(f"no {what} in {timeout} s")


def trainer_pid(folder):
    """The pid of the train.py that holds a trial's run folder (its .lock names it), or None."""
    lock = folder / ".lock"
    m = re.match(r"process (\d+) ", lock.read_text()) if lock.is_file() else None
    return int(m.group(1)) if m else None


@pytest.fixture(scope="module")
def killed_and_resumed(bert_dir, tmp_path_factory):
    """A 3-trial search, killed with SIGKILL while its second trial trains, then run again with the same command."""
    out = tmp_path_factory.mktemp("search") / "s"
    argv = command(bert_dir, out)
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "support.tune", *argv], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: (out / "trials.tsv").is_file(), "finished first trial", proc)
        pid = wait_until(lambda: trainer_pid(out / "trials" / "1"), "second trial's train.py", proc)
        proc.kill()  # SIGKILL: no handler of the search runs
        proc.wait(timeout=60)
    finally:
        proc.kill()
    before = {t.number: t for t in study_of(out).get_trials()}
    deadline = time.time() + 10
    while running(pid) and time.time() < deadline:
        time.sleep(0.05)
    left_running = running(pid)
    killed_output = (out / "trials" / "1" / "train.out").read_text()  # before the search runs it again
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")
        status, stdout, stderr = main(argv)
    return dict(out=out, argv=argv, before=before, pid=pid, left_running=left_running, killed_output=killed_output,
                status=status, stdout=stdout, stderr=stderr)


def test_a_search_writes_its_study_its_table_and_the_best_trials_train_line(killed_and_resumed):
    r = killed_and_resumed
    out = r["out"]
    assert r["status"] == 0 and r["stderr"] == "", r["stderr"]  # Optuna's own logging stays quiet
    rows = table(out)
    assert [row["number"] for row in rows] == ["0", "1", "2"] and {row["state"] for row in rows} == {"complete"}
    for row in rows:
        assert row["batch"] == "32" and row["negatives"] == "1,1,1" and row["epochs"] == "1"  # as --space fixed them
        assert float(row["lr"]) > 0 and row["prompts"] in ("2,0,0", "10,10,10", "0,0,0")
        assert row["calib"] in ("1", "none")  # the tiny BERT's middle and last layer are both layer 1
        assert re.fullmatch(r"1:0\.\d{4}", row["dev"]) and row["dev"].endswith(row["value"])  # one dev point
        assert row["steps"] == "2" and float(row["wall_s"]) > 0
        folder = out / "trials" / row["number"]
        assert "dev after epoch 1: mrr" in (folder / "log.txt").read_text()
        assert not list(folder.glob("*.safetensors"))  # weights go when a trial ends; its log stays
    assert (out / "study.db").stat().st_size < 1 << 20  # settings and figures, no weights: small enough to commit
    # one line a trial, then the summary and the line that trains the best trial again
    lines = r["stdout"].splitlines()
    assert [line.split(" | ")[0] for line in lines[:-2]] == ["trial 1 complete", "trial 2 complete"], r["stdout"]
    best = max(rows, key=lambda row: float(row["value"]))
    assert re.fullmatch(rf"3 trials \(3 complete\) in {re.escape(str(out))}/trials.tsv; best trial {best['number']}, "
                        rf"dev mrr {best['value']}; to train it:", lines[-2])
    assert lines[-1] == (out / "best.txt").read_text().strip()
    argv = shlex.split(lines[-1])
    assert argv[:2] == ["python", "train.py"] and argv[-2:] == ["--out", str(out / "best")]
    run = train.parse_args(argv[2:])
    assert (run.lr, run.head_lr, run.warmup) == tuple(float(best[k]) for k in ("lr", "head_lr", "warmup"))
    assert (run.batch, run.negatives, run.epochs, run.seed, run.dtype) == (32, (1, 1, 1), 1, 42, "fp32")
    assert ",".join(map(str, run.prompts)) == best["prompts"] and run.calib == (() if best["calib"] == "none" else (1,))
    for setting in ("--dev-limit 100", "--dev-sample 1000", "--recipe paper", "--seed 42"):  # the recipe's, spelled out
        assert setting in lines[-1]


def test_a_killed_search_resumes_with_the_same_command_and_keeps_its_finished_trials(killed_and_resumed):
    r = killed_and_resumed
    # its train.py ended with the search, killed: it did not run to its end ("trained N steps ...")
    assert not r["left_running"], f"train.py {r['pid']} outlived the search killed with SIGKILL"
    assert "\ntrained " not in r["killed_output"], r["killed_output"]
    first, killed = r["before"][0], r["before"][1]
    assert first.state == optuna.trial.TrialState.COMPLETE and killed.state == optuna.trial.TrialState.RUNNING
    trials = study_of(r["out"]).get_trials()
    assert len(trials) == 3 and all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)  # none lost, none twice
    assert (trials[0].value, trials[0].params) == (first.value, first.params)  # kept, not trained again
    assert trials[1].params == killed.params and trials[1].user_attrs["note"] == "resumed"  # the same settings again
    assert "trial 0 " not in r["stdout"]


def test_the_report_shows_the_top_trials_the_importances_and_where_they_ran(killed_and_resumed):
    """--report, on the killed and resumed search: markdown rows of the top trials by dev figure, best first, fANOVA
    importances of the searched parameters, the trials' hours and the machine each segment ran on; it trains nothing."""
    out = killed_and_resumed["out"]
    rows = sorted(table(out), key=lambda row: float(row["value"]), reverse=True)
    before = sorted(p.name for p in out.rglob("*"))
    status, stdout, stderr = main(["--report", "--out", str(out), "--top", "2"])
    assert status == 0 and stderr == "", stderr
    lines = stdout.splitlines()
    head = re.fullmatch(rf"{re.escape(str(out))}: 3 trials \(3 complete\), \d+\.\d h of trials on (.+)", lines[0])
    cpu = devices.machine().rsplit(", ", 1)[0]  # the killed search ran its trials on one thread, this process on more
    assert head and all(re.fullmatch(rf"{re.escape(cpu)}, \d+ threads?", m) for m in head.group(1).split("; ")), lines[0]
    header = [c.strip() for c in lines[2].strip("|").split("|")]
    assert header[:2] == ["trial", "dev mrr"] and header[-2:] == ["dev by epoch", "s"] and "lr" in header
    shown = [[c.strip() for c in line.strip("|").split("|")] for line in lines[4:6]]
    assert [(r[0], r[1]) for r in shown] == [(row["number"], row["value"]) for row in rows[:2]]
    assert lines[6] == "" and lines[7].startswith("importances (fANOVA over 3 complete trials): ")
    assert {part.rsplit(" ", 1)[0] for part in lines[7].split(": ", 1)[1].split(", ")} <= set(header[2:-2])
    assert sorted(p.name for p in out.rglob("*")) == before
    # a resumed trial ran twice: both segments name their machine
    assert len(study_of(out).get_trials()[1].user_attrs["machines"]) == 2


def test_a_report_of_a_folder_without_a_study_is_one_line(tmp_path):
    with pytest.raises(SystemExit) as e:
        main(["--report", "--out", str(tmp_path)])
    assert e.value.code == f"error: --report: {tmp_path} holds no study.db"


def test_a_search_on_a_graph_without_dev_is_refused_in_one_line_before_any_trial(bert_dir, tmp_path):
    own = tmp_path / "own"
    own.mkdir()
    for split in ("train", "test"):
        (own / f"{split}.tsv").write_bytes((ROOT / EXAMPLE / f"{split}.tsv").read_bytes())
    with pytest.raises(SystemExit) as e:
        tune.main(command(bert_dir, tmp_path / "s", space=CHEAP)[:-3] + ["--data", str(own)])
    assert e.value.code == (f"error: --data {own}: no dev split ({own / 'dev.tsv'}), and a trial is judged by its "
                            "dev figure: add one")
    assert not (tmp_path / "s").exists()


def test_a_trial_behind_the_median_at_its_first_dev_point_is_pruned_there(bert_dir, tmp_path, monkeypatch):
    """--pruner median --startup-trials 1: once one trial has finished, a trial whose first dev figure is below the
    finished one's at the same epoch ends there. An lr of 1e-7 leaves the tiny BERT as it starts; 1e-2 wrecks it."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    space = "lr={lr},head_lr={lr},batch=8,negatives=1,1,1,epochs={epochs},warmup=0.1,prompts=2,0,0,calib=last"
    fixed = ["--pruner", "median", "--startup-trials", "1"]
    status, stdout, _ = main(command(bert_dir, tmp_path, *fixed, space=space.format(lr=1e-7, epochs=1), trials=1))
    assert status == 0 and stdout.startswith("trial 0 complete")
    status, stdout, stderr = main(command(bert_dir, tmp_path, *fixed, space=space.format(lr=1e-2, epochs=2), trials=2))
    assert status == 0 and stdout.startswith("trial 1 pruned") and stderr == "", stdout + stderr
    good, bad = study_of(tmp_path).get_trials()
    assert good.state == optuna.trial.TrialState.COMPLETE and bad.state == optuna.trial.TrialState.PRUNED
    assert list(good.intermediate_values) == [1000]  # the dev point of epoch 1, at step 1000 x the epoch
    assert list(bad.intermediate_values) == [1000] and bad.intermediate_values[1000] < good.intermediate_values[1000]
    log = (tmp_path / "trials" / "1" / "log.txt").read_text()
    assert "dev after epoch 1:" in log and "epoch 2/2" not in log  # its train.py ended at the dev point
    assert table(tmp_path)[1]["state"] == "pruned" and table(tmp_path)[1]["note"] == "pruned at epoch 1"
    # A trial as far behind whose first dev point is its last has trained in full: complete, not pruned.
    status, stdout, _ = main(command(bert_dir, tmp_path, *fixed, space=space.format(lr=1e-2, epochs=1), trials=3))
    assert status == 0 and stdout.startswith("trial 2 complete"), stdout
    last = study_of(tmp_path).get_trials()[2]
    assert last.state == optuna.trial.TrialState.COMPLETE and last.user_attrs["epochs"] == 1
    assert last.intermediate_values[1000] < good.intermediate_values[1000]


@pytest.mark.parametrize("space, extra, said", [
    ("momentum=0.9:0.99", [], "--space momentum: unknown parameter (the search knows lr, head_lr, batch, negatives, "
                              "epochs, warmup, prompts, calib, adam_beta2, adam_eps, head_input, lora_rank, lora_alpha)"),
    ("lr=1e-3:1e-4", [], "--space lr=1e-3:1e-4: an empty range (0.001 > 0.0001)"),
    ("epochs=4:3", [], "--space epochs=4:3: an empty range (4 > 3)"),
    ("epochs=", [], "--space epochs=: no values (give low:high, a value, or choices a|b)"),
    ("batch=8|", [], "--space batch=8|: an empty value"),
    ("batch=8:32", [], "--space batch=8:32: batch takes choices like 8|16|32, not a range"),
    ("prompts=2,0,0", ["--method", "finetune"], "--space prompts: --method finetune does not search it"),
    ("negatives=0,0,0", [], "train.py refuses the trials' flags: --negatives 0,0,0 leaves no false triples to learn "
                            "from: give at least one corruption per positive"),
    ("lr=1e-4", ["--", "--lr", "1e-3"], "flags after --: --lr is searched (--space lr=... fixes or narrows it)"),
    ("epochs=2", ["--positives", "64"], "--space epochs: --positives 64 sets each trial's length"),
    ("lr=1e-4", ["--positives", "64", "--", "--max-steps", "3"], "flags after --: --max-steps is set by --positives 64"),
])
def test_a_bad_space_is_refused_in_one_line_before_anything_is_written(bert_dir, tmp_path, space, extra, said):
    with pytest.raises(SystemExit) as e:
        tune.main(["--data", EXAMPLE, "--model", str(bert_dir), "--out", str(tmp_path / "s"), "--space", space, *extra])
    assert e.value.code == f"error: {said}"
    assert not (tmp_path / "s").exists()


def test_a_budget_in_positives_gives_each_batch_size_the_same_triples_and_dev_points_at_its_quarters(bert_dir, tmp_path,
                                                                                               monkeypatch):
    """--positives 128 on 94 train triples: batch 32 trains 4 steps (2 an epoch), batch 16 8 steps (5 an epoch), both
    128 positives, each with a dev point after each quarter of its steps and at each epoch's end; epochs are not
    searched. (On a big graph the quarters fall at the same fractions of an epoch whatever the batch; here the epochs
    of 94 triples hold 64 and 80 positives.)"""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    seen = {}
    for batch in (32, 16):
        out = tmp_path / str(batch)
        argv = command(bert_dir, out, "--positives", "128", space=f"batch={batch},negatives=1,1,1", trials=1)
        argv.remove("--max-epochs")
        argv.remove("1")
        status, stdout, stderr = main(argv)
        assert status == 0, stderr
        (row,) = table(out)
        assert row["state"] == "complete" and "epochs" not in row and row["steps"] == str(128 // batch)
        seen[batch] = [point.split(":")[0] for point in row["dev"].split()]
        line = (out / "best.txt").read_text()
        assert f"--epochs 2 --max-steps {128 // batch}" in line and f"--dev-every {128 // batch // 4}" in line
    assert seen == {32: ["0.5", "1", "1.5", "2"], 16: ["0.4", "0.8", "1", "1.2", "2"]}, seen  # steps 2,4,6 (+5,8) of 16


def test_a_trial_resumes_in_the_precision_its_state_was_saved_in(bert_dir, tmp_path, monkeypatch):
    """A search that moves to another machine resolves --dtype auto there anew; the trial it resumes keeps the
    precision its state was saved in, which train.py requires."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "trial"
    train.main(train.parse_args(["--data", EXAMPLE, "--model", str(bert_dir), "--epochs", "1", "--dtype", "bf16",
                                 "--out", str(out)]))
    assert tune.resume_flags(out / "state.safetensors") == ["--resume", "--dtype", "bf16"]
    run = train.parse_args(["--data", EXAMPLE, "--dtype", "auto", "--out", str(out), *tune.resume_flags(out / "state.safetensors")])
    assert (run.resume, run.dtype) == (True, "bf16")  # the later flag wins over the search's own --dtype


def test_a_folder_in_use_is_refused_but_joined_with_join_and_another_search_is_refused(killed_and_resumed):
    r = killed_and_resumed
    out, argv = r["out"], r["argv"]
    holder = subprocess.Popen([sys.executable, "-c", f"from support import files; files.lock_folder({str(out)!r}, "
                               "'--out', ''); print('held', flush=True); input()"], cwd=ROOT, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert re.fullmatch(rf"error: {re.escape(str(out))} \(--out\) is in use by process {holder.pid} on \S+ "
                            r"\(since [\d-]+ [\d:]+\): wait for it to end, or add --join to work on the same study "
                            "beside it", e.value.code)
        status, stdout, _ = main(argv[:argv.index("--")] + ["--join"] + argv[argv.index("--"):])
        assert status == 0 and stdout.startswith("3 trials (3 complete)")  # the study has its trials: none more
    finally:
        holder.kill()
        holder.wait()
    with pytest.raises(SystemExit) as e:
        main(argv[:argv.index("--")] + ["--seed", "7"] + argv[argv.index("--"):])
    assert e.value.code == (f"error: {out} holds a search with seed 42, not 7: the same command resumes it; choose "
                            "another --out for another")
    with pytest.raises(SystemExit) as e:  # Optuna keeps a choice's choices
        main([a.replace("batch=32", "batch=16|32") for a in argv])
    assert e.value.code.startswith(f"error: --space batch: {out} searched it in CategoricalDistribution(choices=(32,))")


def test_without_optuna_it_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(tune, "optuna", None)
    with pytest.raises(SystemExit) as e:
        tune.main(["--data", EXAMPLE])
    assert e.value.code == "support.tune needs optuna: pip install optuna"


def test_a_choice_that_carries_a_further_flag_reaches_train_py_as_two_flags(bert_dir, tmp_path):
    """The authors' one head-or-tail negative is the choice '1,0,1 --either-side': train.py gets both flags."""
    args = tune.parse_args(command(bert_dir, tmp_path / "s", space="negatives=1,0,1 --either-side"))
    argv = tune.train_argv(args, {"negatives": tune.EITHER}, tmp_path / "s" / "trials" / "0")
    assert argv[argv.index("--negatives"):][:3] == ["--negatives", "1,0,1", "--either-side"]
    run = train.parse_args(argv)
    assert run.either_side and run.negatives == (1, 0, 1)


def test_try_recipe_trains_the_recipes_own_settings_once_and_refuses_one_outside_the_space(bert_dir, tmp_path,
                                                                                             monkeypatch):
    """--try-recipe: the first trial takes the recipe's settings (a head's lr the LM's, calibration PALT's middle and
    last, epochs capped at --max-epochs) with the items given changing some; the same command again does not try it
    twice. A recipe's setting outside the space is refused in one line, before anything is written."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "s"
    with pytest.raises(SystemExit) as e:
        main(command(bert_dir, out, "--try-recipe", space="batch=16|32,negatives=1,1,1", trials=1))
    assert e.value.code == "error: --try-recipe: batch 8 is not one of the searched 16|32 (give batch=...)"
    assert not out.exists()
    tried = ["--try-recipe", "batch=32,negatives=1,1,1,lr=2e-3"]
    status, stdout, stderr = main(command(bert_dir, out, *tried, space="batch=16|32,negatives=1,1,1", trials=1))
    assert status == 0, stderr
    run = train.parse_args(["--data", EXAMPLE, "--model", str(bert_dir), "--out", str(tmp_path / "r")])
    (trial,) = study_of(out).get_trials()
    # The tiny BERT's 2 layers: PALT calibrates its middle and last, layer 1 both.
    assert trial.params == {"lr": 2e-3, "head_lr": run.head_lr or run.lr, "batch": 32, "negatives": "1,1,1",
                            "epochs": 1, "warmup": run.warmup, "prompts": ",".join(map(str, run.prompts)),
                            "calib": "1", "adam_beta2": run.adam_beta2, "adam_eps": run.adam_eps,
                            "head_input": run.head_input}
    assert table(out)[0]["note"] == "the default recipe with batch=32,negatives=1,1,1,lr=2e-3"
    status, stdout, stderr = main(command(bert_dir, out, *tried, space="batch=16|32,negatives=1,1,1", trials=2))
    assert status == 0, stderr
    first, second = study_of(out).get_trials()
    assert second.params != first.params and table(out)[1]["note"] == ""


def test_each_method_searches_its_own_parts(bert_dir):
    """LoRA searches its rank and alpha, prompt tuning its prompts, a probe one lr (only heads train), finetuning
    lr up to 1e-3; a trial's train.py line names the method."""
    names = {m: [p.name for p in tune.search_space(m, [], 4, str(bert_dir))] for m in tune.METHODS}
    assert {"lora_rank", "lora_alpha", "head_lr"} <= set(names["lora"]) and "prompts" not in names["lora"]
    assert "prompts" in names["prompt"] and "calib" not in names["prompt"]
    assert "head_lr" not in names["probe"] and "head_lr" not in names["finetune"]
    assert set(names["bitfit"]) == set(names["probe"]) | {"head_lr"}
    lr = next(p for p in tune.search_space("finetune", [], 4, str(bert_dir)) if p.name == "lr")
    assert lr.values == (1e-5, 1e-3)
    assert tune.METHOD_FLAGS["lora"] == ["--method", "lora"] and tune.METHOD_FLAGS["finetune"] == ["--finetune"]

def frozen(number, state, points, epochs=None, attrs=None):
    """A trial as Optuna stores it: its dev points {epoch: value}, its epochs setting (None: a budget search)."""
    params = {"epochs": epochs} if epochs else {}
    dists = {"epochs": optuna.distributions.IntDistribution(1, 4)} if epochs else {}
    steps = {round(e * tune.STEPS_AN_EPOCH): v for e, v in points.items()}
    value = max(points.values()) if state == optuna.trial.TrialState.COMPLETE else None
    t = optuna.trial.create_trial(state=state, params=params, distributions=dists, value=value,
                                  intermediate_values=steps, user_attrs=attrs or {})
    t.number = number
    return t


def test_a_trial_pruned_at_its_last_dev_point_counts_as_complete_with_its_best_epoch_end():
    """UMLS PALT's trial 13 of 2026-12-02: pruned at epoch 4 of 4, after it had trained in full."""
    PRUNED, COMPLETE = optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.COMPLETE
    at_end = frozen(13, PRUNED, {1: .3763, 2: .5014, 3: .6012, 4: .6192}, epochs=4)
    early = frozen(5, PRUNED, {1: .2459}, epochs=3)
    budget_end = frozen(7, PRUNED, {0.028: .75, 0.057: .77, 0.085: .78, 1: .79})  # --positives: ends at epoch 1
    budget_early = frozen(8, PRUNED, {0.028: .60})
    recorded = frozen(9, PRUNED, {1: .5, 2: .6}, epochs=4, attrs={"epochs": 2})  # the planned epochs it recorded
    assert [tune.state_of(t) for t in (at_end, early, budget_end, budget_early, recorded)] == \
        ["complete", "pruned", "complete", "pruned", "complete"]
    assert tune.value_of(at_end) == .6192 and tune.value_of(early) is None and tune.value_of(budget_end) == .79
    assert tune.state_of(frozen(1, COMPLETE, {1: .4, 2: .3}, epochs=2)) == "complete"
    assert tune.counts_text([at_end, early, budget_early]) == "1 complete, 2 pruned"


def test_the_report_counts_old_studies_by_that_rule_and_shows_ties():
    """The committed UMLS PALT study: trial 13 (pruned at its epoch 4) counts as complete; trials 14 and 22 tie at
    .7109 for the third place and both are shown."""
    pytest.importorskip("sklearn")
    text = tune.report(ROOT / "results" / "tune-umls-palt", top=3)
    assert "30 trials (16 complete, 14 pruned)" in text
    rows = [line.split(" | ")[0].strip("| ") for line in text.splitlines() if re.match(r"\| \d", line)]
    assert rows == ["17", "28", "14", "22"]


def test_every_worker_draws_from_a_seed_the_study_records():
    """The lead draws from --seed plus the trials it found, each --join worker 1000 further on, each recorded."""
    study = optuna.create_study(direction="maximize")
    lead = tune.parse_args(["--data", EXAMPLE, "--seed", "7"])
    join = tune.parse_args(["--data", EXAMPLE, "--seed", "7", "--join"])
    assert tune.worker_seed(study, lead, 0) == 7
    assert tune.worker_seed(study, join, 3) == 1010 and tune.worker_seed(study, join, 4) == 2011
    assert tune.worker_seed(study, lead, 5) == 12  # the lead again, resumed
    assert [(w["index"], w["seed"], w["joined"]) for w in study.user_attrs["workers"]] == \
        [(0, 7, False), (1, 1010, True), (2, 2011, True), (0, 12, False)]


def test_a_draw_that_repeats_an_earlier_trials_settings_is_not_trained_and_does_not_count(tmp_path, capsys):
    """Optuna's draws 4 and 5 of the lr alone from seed 42, 0.0017000 and 0.0016999, are one train.py run at 3
    significant digits: the second is told failed without training, drawn again, and left out of --trials."""
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=42))
    params = [tune.Param("lr", "log", (1e-3, 3e-2))]
    trained = []
    while (got := tune.next_trial(study, tmp_path, params, 6)) is not None:
        trial, _, claim, settings = got
        claim.close()
        trained.append((trial.number, tune.flag_text(settings["lr"])))
        study.tell(trial, 0.5)
    assert [n for n, _ in trained] == [0, 1, 2, 3, 4, 6] and trained[4][1] == "0.0017"
    assert len(set(lr for _, lr in trained)) == 6  # six runs, each its own lr
    trials = study.get_trials(deepcopy=False)
    assert tune.repeats(trials) == {5: 4} and len(tune.counted(trials)) == 6
    assert trials[5].state == optuna.trial.TrialState.FAIL
    assert "trial 5 repeats trial 4's settings: not trained, drawn again" in capsys.readouterr().out
    assert tune.counts_text(trials) == "6 complete; 1 repeat, not counted"
    tune.write_table(study, tmp_path)
    row = (tmp_path / "trials.tsv").read_text().splitlines()[6].split("\t")
    assert row[:2] == ["5", "repeat"] and row[-1] == "repeats trial 4: not trained"


def test_a_space_with_fewer_settings_than_trials_is_refused_in_one_line(tmp_path):
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=0))
    params = [tune.Param("batch", "choice", (8, 16))]
    with pytest.raises(tune.TuneError, match="100 draws in a row repeated earlier trials' settings"):
        while (got := tune.next_trial(study, tmp_path, params, 3)) is not None:
            got[2].close()
            study.tell(got[0], 0.5)
