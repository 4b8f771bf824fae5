"""bench/finals.py's planning, through --dry-run on a temporary results folder: what it would run, what it skips,
and its one-line refusal where a method's search has no best trial yet. Nothing trains."""
import shlex

import pytest

import train
from palt import build_palt, param_report
from support import tables

from conftest import clear_table_caches, study_with

finals = tables.bench("finals")


@pytest.fixture
def results(tmp_path, monkeypatch):
    """An empty results folder in place of the project's, the tables' caches emptied around it."""
    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    clear_table_caches()
    yield tmp_path
    clear_table_caches()


def planned(capsys, *argv):
    """(command lines, skip lines) that a dry run prints."""
    assert finals.main([*argv, "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    return [x for x in lines if not x.startswith("#")], [x for x in lines if x.startswith("#")]


def test_table4_plans_a_final_a_variant_and_seed_each_training_then_evaluating_in_fp32(results, capsys):
    commands, skipped = planned(capsys, "table4")
    assert len(commands) == 16 and not skipped  # 8 variants x seeds 42, 1
    first = commands[0].split(" && ")
    assert first == ["python train.py --data wn11 --epochs 1 --recipe tuned --seed 42 --dtype auto --out runs/table4-palt-s42",
                     "python evaluate.py --tc --ckpt runs/table4-palt-s42 --dtype fp32 --out results/table4/wn11-palt-s42.json"]
    assert [c.split("--out runs/table4-")[1].split(" ")[0] for c in commands[:8]] == [f"{v}-s42" for v in tables.TABLE4]
    assert "--method finetune --recipe tuned-finetune --seed 1" in commands[-1]
    for command in commands:  # every training line is one train.py takes
        train.parse_args(shlex.split(command.split(" && ")[0])[2:])


def test_a_final_whose_json_exists_is_skipped_and_a_run_with_a_state_resumes(results, capsys, monkeypatch, tmp_path_factory):
    (results / "table4").mkdir()
    (results / "table4" / "wn11-nowp-s1.json").write_text("{}")
    root = tmp_path_factory.mktemp("repository")
    (root / "runs" / "table4-probe-s42").mkdir(parents=True)
    (root / "runs" / "table4-probe-s42" / "state.safetensors").write_bytes(b"")
    monkeypatch.setattr(finals, "ROOT", root)
    commands, skipped = planned(capsys, "table4")
    assert len(commands) == 15 and skipped == ["# results/table4/wn11-nowp-s1.json exists: skipped"]
    assert not any("table4-nowp-s1" in c for c in commands)
    probe = next(c for c in commands if "runs/table4-probe-s42" in c)
    assert "--out runs/table4-probe-s42 --resume && python evaluate.py" in probe
    assert sum("--resume" in c for c in commands) == 1


def ended_search(results, name, values):
    """results/NAME with a trials.tsv of these values, every trial complete, and a best.txt."""
    (results / name).mkdir()
    rows = "".join(f"{n}\tcomplete\t{v}\n" for n, v in enumerate(values))
    (results / name / "trials.tsv").write_text("number\tstate\tvalue\n" + rows)
    (results / name / "best.txt").write_text(f"python train.py --data umls --lr 0.0006 --seed 42 --out runs/{name}/best\n")


def refusal(*argv):
    with pytest.raises(SystemExit) as stop:
        finals.main([*argv, "--dry-run"])
    said = str(stop.value)
    assert "\n" not in said and said.startswith("error: ")
    return said


def test_a_final_waits_in_one_line_for_its_search_to_hold_its_trials(results):
    assert "results/tune-umls-lora holds 0 of its 30 trials, ended: the lora final on umls waits for it" in refusal(
        "methods", "--graph", "umls", "--methods", "lora")
    ended_search(results, "tune-umls-lora", [.5] * 29)
    assert "holds 29 of its 30 trials" in refusal("methods", "--graph", "umls", "--methods", "lora")


def test_finetuning_takes_its_second_searchs_best_only_where_that_beats_the_first(results, capsys):
    said = refusal("methods", "--graph", "umls", "--methods", "finetune")
    assert "results/tune-umls-finetune-lr holds 0 of its 10 trials, ended: the finetune final on umls waits" in said
    ended_search(results, "tune-umls-finetune", [.84, .70])
    ended_search(results, "tune-umls-finetune-lr", [.80] * 10)
    commands, _ = planned(capsys, "methods", "--graph", "umls", "--methods", "finetune", "--seeds", "42")
    assert "--method finetune --recipe tuned-finetune --epochs 8" in commands[0]  # the first search's best stands
    (results / "tune-umls-finetune-lr" / "trials.tsv").write_text("number\tstate\tvalue\n0\tcomplete\t0.85\n"
                                                                  + "".join(f"{n}\tpruned\t\n" for n in range(1, 10)))
    commands, _ = planned(capsys, "methods", "--graph", "umls", "--methods", "finetune", "--seeds", "42")
    assert commands[0].startswith("python train.py --data umls --lr 0.0006 --search 'results/tune-umls-finetune-lr "
                                  "trial 0' --epochs 8 --seed 42")  # the second search's best, which names it


def test_methods_take_the_searched_settings_at_the_finals_budget(results, capsys):
    ended_search(results, "tune-wn11-lora", [.8, .7, .7, .81, .81] + [.6] * 15)  # the best: trial 3
    (results / "tune-wn11-lora" / "best.txt").write_text(
        "python train.py --data wn11 --recipe cpu --model minilm --epochs 1 --max-steps 1600 --lr 0.000453 --batch 8 "
        "--method lora --lora-rank 8 --dev-every 400 --dtype fp32 --seed 42 --out runs/tune-wn11-lora/best\n")
    commands, _ = planned(capsys, "methods", "--graph", "wn11", "--seeds", "1", "--methods", "palt,lora")
    assert len(commands) == 2
    lora = commands[1].split(" && ")
    assert lora == ["python train.py --data wn11 --recipe cpu --model minilm --lr 0.000453 --batch 8 --method lora "
                    "--lora-rank 8 --search 'results/tune-wn11-lora trial 3' --epochs 1 --seed 1 --dtype auto "
                    "--out runs/wn11-lora-s1",
                    "python evaluate.py --tc --ckpt runs/wn11-lora-s1 --dtype fp32 --out results/methods/wn11-lora-s1.json"]
    palt, _ = planned(capsys, "table4", "--seeds", "1")
    assert commands[0].split(" && ")[0] == palt[0].split(" && ")[0]  # WN11's PALT final is Table 4's run
    assert commands[0].split(" && ")[1] == ("python evaluate.py --tc --ckpt runs/table4-palt-s1 --dtype fp32 "
                                            "--out results/methods/wn11-palt-s1.json")
    run = train.parse_args(shlex.split(lora[0])[2:])  # train.py takes it, at the final's budget
    assert (run.method, run.epochs, run.max_steps, run.dev_every, run.seed) == ("lora", 1, None, None, 1)


def test_lora_at_palts_count_is_loras_searched_settings_at_a_rank_that_meets_palts_count(results, capsys):
    ended_search(results, "tune-wn11-lora", [.8] * 20)
    (results / "tune-wn11-lora" / "best.txt").write_text(
        "python train.py --data wn11 --recipe cpu --model minilm --lr 0.0017 --method lora --lora-rank 8 "
        "--lora-alpha 16.0 --seed 42 --out runs/tune-wn11-lora/best\n")
    commands, _ = planned(capsys, "methods", "--graph", "wn11", "--seeds", "42", "--methods", "palt,lora-r48")
    palt, wide = (train.parse_args(shlex.split(c.split(" && ")[0])[2:]) for c in commands)
    assert (wide.method, wide.lora_rank, wide.lora_alpha, wide.lr) == ("lora", 48, 16.0, 0.0017)
    assert commands[1].endswith("--out runs/wn11-lora-r48-s42 && python evaluate.py --tc --ckpt runs/wn11-lora-r48-s42 "
                                "--dtype fp32 --out results/methods/wn11-lora-r48-s42.json")
    counts = [param_report(build_palt(run.model, train.palt_config(run))[0])["tunable"] for run in (palt, wide)]
    assert palt.model == wide.model == "minilm" and abs(counts[1] / counts[0] - 1) < 0.01  # PALT's count


def test_umls_methods_train_8_epochs_and_rank_once_keeping_the_ranks(results, capsys):
    ended_search(results, "tune-umls-finetune", [.84])
    ended_search(results, "tune-umls-finetune-lr", [.80] * 10)
    commands, _ = planned(capsys, "methods", "--graph", "umls", "--methods", "finetune")
    assert len(commands) == 3  # seeds 42, 1, 2
    trained, full = commands[0].split(" && ")
    assert "--method finetune --recipe tuned-finetune --epochs 8 --seed 42" in trained
    assert full.endswith("--lp --keep-ranks --ckpt runs/umls-finetune-s42 --dtype fp32 "
                         "--out results/methods/umls-finetune-s42.json")
    (results / "methods").mkdir()
    (results / "methods" / "umls-finetune-s42.json").write_text("{}")  # done: nothing left to run
    commands, _ = planned(capsys, "methods", "--graph", "umls", "--methods", "finetune", "--seeds", "42")
    assert commands == []


def test_every_search_is_one_support_tune_takes_and_pins_the_tuned_settings(results, capsys):
    """Each search's command passes support.tune's own checks (its space, and train.py's checks of
    every choice and range end) without training; prompt tuning and the probe search only their lr,
    at PALT's tuned settings; finetuning's second search its lr up to 1e-3."""
    tune = pytest.importorskip("support.tune")
    pytest.importorskip("optuna")
    commands, _ = planned(capsys, "searches")
    assert len(commands) == 10
    for command in commands:
        args = tune.parse_args(shlex.split(command)[3:])
        args.n_train = 1000
        params = tune.search_space(args.method, args.space, args.max_epochs, args.model, args.positives)
        tune.check_train_args(args, params)
        tune.check_with_train(args, params, results / "check")
        searched = {p.name for p in params if len(set(p.values)) > 1}
        if "prompt" in command or "probe" in command or "finetune" in command:
            assert searched == {"lr"}, command
    prompt = next(c for c in commands if "tune-umls-prompt" in c)
    assert "lr=0.00078" not in prompt and "head_lr=0.00205" in prompt and "negatives=1,1,1" in prompt
    assert "lr=1e-4:1e-3" in next(c for c in commands if "tune-wn11-finetune-lr" in c)


def test_a_search_with_its_trials_ended_is_skipped(results, capsys):
    folder = results / "tune-wn11-probe"
    folder.mkdir()
    rows = "".join(f"{n}\tcomplete\n" for n in range(7)) + "7\trunning\n"
    (folder / "trials.tsv").write_text("number\tstate\n" + rows)
    commands, _ = planned(capsys, "searches", "--only", "tune-wn11-probe")
    assert commands == [finals.search_command("tune-wn11-probe", finals.searches()["tune-wn11-probe"])]
    (folder / "trials.tsv").write_text("number\tstate\n" + rows.replace("running", "pruned"))
    commands, skipped = planned(capsys, "searches", "--only", "tune-wn11-probe")
    assert commands == [] and skipped == ["# results/tune-wn11-probe holds its 8 trials: skipped"]


def test_sync_copies_the_study_and_the_ended_trials_logs_only(results, tmp_path):
    import sqlite3
    run = tmp_path / "runs" / "tune-umls-probe"
    for n in (0, 1):
        (run / "trials" / str(n)).mkdir(parents=True)
        (run / "trials" / str(n) / "log.txt").write_text(f"trial {n}\n")
        (run / "trials" / str(n) / "state.safetensors").write_text("weights")
    (run / "trials.tsv").write_text("number\tstate\n0\tpruned\n1\trunning\n")
    (run / "best.txt").write_text("python train.py --lr 0.001\n")
    with sqlite3.connect(run / "study.db") as db:
        db.execute("create table t (x)")
        db.execute("insert into t values (7)")
    assert finals.main(["sync", "--runs", str(tmp_path / "runs")]) == 0
    kept = results / "tune-umls-probe"
    assert sorted(p.relative_to(kept).as_posix() for p in kept.rglob("*") if p.is_file()) == [
        "best.txt", "study.db", "trials.tsv", "trials/0/log.txt"]
    assert sqlite3.connect(kept / "study.db").execute("select x from t").fetchall() == [(7,)]


def test_jobs_run_side_by_side_and_a_failure_is_reported(tmp_path):
    import threading
    barrier = threading.Barrier(2, timeout=10)  # both must be running at once to pass it

    def job(code):
        barrier.wait()
        return code
    assert finals.in_parallel(2, [(job, (0,)), (job, (0,))]) == 0
    barrier.reset()
    assert finals.in_parallel(2, [(job, (0,)), (job, (3,))]) == 1


def test_a_signal_passes_to_the_running_commands_and_starts_no_other(tmp_path, monkeypatch):
    import signal
    import sys
    import threading
    import time
    monkeypatch.setattr(finals, "STOP", [])
    ready, saved = tmp_path / "ready", tmp_path / "saved"
    child = (f"import signal, sys, time, pathlib; "
             f"signal.signal(signal.SIGINT, lambda *a: (pathlib.Path({str(saved)!r}).write_text('x'), sys.exit(0))); "
             f"pathlib.Path({str(ready)!r}).write_text('x'); time.sleep(60)")
    codes = []
    worker = threading.Thread(target=lambda: codes.append(finals.call(shlex.join([sys.executable, "-c", child]))))
    worker.start()
    for _ in range(200):
        if ready.exists():
            break
        time.sleep(0.05)
    finals.on_signal(signal.SIGINT, None)
    worker.join(timeout=30)
    assert codes == [0] and saved.exists()  # the command got the signal and stopped in its own way
    assert finals.call("python -c 'print(1)'") == 130  # and nothing starts after it
    assert finals.run_final(None, ["python -c 'print(1)'"], None) == 130


def test_a_final_that_ends_keeps_its_training_log_beside_each_json(results, monkeypatch, tmp_path_factory):
    import sys
    root = tmp_path_factory.mktemp("repository")
    (root / "runs" / "table4-palt-s42").mkdir(parents=True)
    (root / "runs" / "table4-palt-s42" / "log.txt").write_text("epoch 1/1 step 20/14072 loss 0.6785\n")
    monkeypatch.setattr(finals, "ROOT", root)
    (results / "methods").mkdir()
    out = results / "methods" / "wn11-palt-s42.json"
    write = shlex.join([sys.executable, "-c", f"import pathlib; pathlib.Path({str(out)!r}).write_text('{{}}')"])
    final = finals.Final("runs/table4-palt-s42", "unused", [("methods/wn11-palt-s42.json", write)])
    assert finals.run_final(final, [write], None) == 0
    kept = results / "methods" / "wn11-palt-s42.train.log"
    assert kept.read_text() == "epoch 1/1 step 20/14072 loss 0.6785\n"
    failing = finals.Final("runs/table4-palt-s42", "unused", [("methods/wn11-palt-s1.json", "")])
    assert finals.run_final(failing, [f"{shlex.quote(sys.executable)} -c 'raise SystemExit(2)'"], None) == 2
    assert not (results / "methods" / "wn11-palt-s1.train.log").exists()  # no JSON, no log beside it


def ended_study(results, name, values_and_lrs, high=3e-3):
    """results/NAME as a search that holds its trials, ended: its study, trials.tsv and best.txt."""
    settings = {"head_lr": 0.000238, "batch": 8, "negatives": "1,0,1 --either-side", "warmup": 0.0143,
                "adam_beta2": 0.999, "adam_eps": 1e-08, "head_input": "mean"}
    study_with(results / name, values_and_lrs, high=high, settings=settings)
    rows = "".join(f"{n}\tcomplete\t{v}\t{lr}\n" for n, (v, lr) in enumerate(values_and_lrs))
    (results / name / "trials.tsv").write_text("number\tstate\tvalue\tlr\n" + rows)
    (results / name / "best.txt").write_text(f"python train.py --data wn11 --lr 0.0029 --seed 42 --out runs/{name}/best\n")


def test_a_search_whose_best_lr_lies_at_the_top_of_its_range_is_followed_by_its_lr_alone(results, capsys):
    ended_study(results, "tune-wn11-bitfit", [(.70, 1e-4)] * 19 + [(.80, 2.9e-3)])  # the best, 99% up the range
    ended_study(results, "tune-wn11-lora", [(.80, 1e-3)] + [(.70, 2.9e-3)] * 19)  # the best, 81% up
    every = finals.searches()
    assert "tune-wn11-bitfit-lr" in every and "tune-wn11-lora-lr" not in every
    second = every["tune-wn11-bitfit-lr"]
    assert second.startswith("--data wn11 --recipe cpu --positives 12800 --method bitfit --trials 10 ")
    space = shlex.split(second)[-1]
    assert space.startswith("head_lr=0.000238,batch=8,negatives=1,0,1 --either-side,warmup=0.0143,")
    assert space.endswith(",head_input=mean,lr=0.001:0.03")  # the lr from a third of the top to ten times it
    tune = pytest.importorskip("support.tune")
    args = tune.parse_args(shlex.split(finals.search_command("tune-wn11-bitfit-lr", second))[3:])
    params = tune.search_space(args.method, args.space, args.max_epochs, args.model, args.positives)
    assert {p.name for p in params if len(set(p.values)) > 1} == {"lr"}  # support.tune takes it: the lr alone
    (results / "tune-wn11-bitfit" / "trials.tsv").write_text("number\tstate\tvalue\tlr\n0\trunning\t\t\n")
    assert "tune-wn11-bitfit-lr" not in finals.searches()  # not before the first search has ended


def test_a_final_takes_the_second_searchs_best_only_where_it_beats_the_first(results, capsys):
    ended_study(results, "tune-wn11-bitfit", [(.70, 1e-4)] * 19 + [(.80, 2.9e-3)])
    said = refusal("methods", "--graph", "wn11", "--methods", "bitfit")
    assert "results/tune-wn11-bitfit-lr holds 0 of its 10 trials, ended: the bitfit final on wn11 waits for it" in said
    ended_search(results, "tune-wn11-bitfit-lr", [.79] * 10)
    commands, _ = planned(capsys, "methods", "--graph", "wn11", "--methods", "bitfit", "--seeds", "42")
    assert "--search 'results/tune-wn11-bitfit trial 19'" in commands[0]
    (results / "tune-wn11-bitfit-lr" / "trials.tsv").write_text(
        "number\tstate\tvalue\n" + "".join(f"{n}\tcomplete\t{.79 + (n == 4) * .02}\n" for n in range(10)))
    commands, _ = planned(capsys, "methods", "--graph", "wn11", "--methods", "bitfit", "--seeds", "42")
    assert "--search 'results/tune-wn11-bitfit-lr trial 4'" in commands[0]


def test_only_may_name_a_second_search_before_it_exists(results, capsys):
    commands, _ = planned(capsys, "searches", "--only", "tune-wn11-probe,tune-wn11-lora-lr")
    assert len(commands) == 1 and "--out runs/tune-wn11-probe " in commands[0]
    with pytest.raises(SystemExit):
        finals.main(["searches", "--only", "tune-wn11-probe-lr", "--dry-run"])
    assert "--only: tune-wn11-probe-lr is not one of" in capsys.readouterr().err


def test_a_search_that_ends_at_the_top_of_its_range_runs_its_second_at_once(results, monkeypatch):
    ran = []

    def run_search(name, flags):  # as if the search ran to its end, its best lr at the top
        ran.append(name)
        if name == "tune-wn11-bitfit" and not (results / name).exists():
            ended_study(results, name, [(.70, 1e-4)] * 19 + [(.80, 2.9e-3)])
        return 0

    monkeypatch.setattr(finals, "run_search", run_search)
    assert finals.run_chain("tune-wn11-bitfit", ["tune-wn11-bitfit"]) == 0
    assert ran == ["tune-wn11-bitfit"]  # --only left the second out
    assert finals.run_chain("tune-wn11-bitfit", None) == 0
    assert ran == ["tune-wn11-bitfit", "tune-wn11-bitfit", "tune-wn11-bitfit-lr"]


def test_a_repeat_of_an_earlier_trials_settings_does_not_count_toward_a_searchs_trials(results, capsys):
    folder = results / "tune-wn11-probe"
    folder.mkdir()
    rows = "".join(f"{n}\tcomplete\n" for n in range(7)) + "7\trepeat\n"
    (folder / "trials.tsv").write_text("number\tstate\n" + rows)
    assert finals.trials_of(folder) == (7, 7)
    commands, _ = planned(capsys, "searches", "--only", "tune-wn11-probe")
    assert len(commands) == 1  # 7 of its 8 trials: it goes on
