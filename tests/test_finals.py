"""bench/finals.py's planning, through --dry-run on a temporary results folder: what it would run, what it skips,
and its one-line refusal where a method's search has no best trial yet. Nothing trains."""
import shlex

import pytest

import train
from support import tables

finals = tables.bench("finals")


@pytest.fixture
def results(tmp_path, monkeypatch):
    """An empty results folder in place of the project's."""
    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    return tmp_path


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


def test_methods_refuse_in_one_line_while_a_search_has_no_best_trial(results):
    with pytest.raises(SystemExit) as stop:
        finals.main(["methods", "--graph", "umls", "--dry-run"])
    said = str(stop.value)
    assert "\n" not in said and said.startswith("error: results/tune-umls-lora/best.txt does not exist yet")


def test_methods_take_the_searched_settings_at_the_finals_budget(results, capsys):
    search = results / "tune-wn11-lora"
    search.mkdir()
    (search / "best.txt").write_text(
        "python train.py --data wn11 --recipe cpu --model minilm --epochs 1 --max-steps 1600 --lr 0.000453 --batch 8 "
        "--method lora --lora-rank 8 --dev-every 400 --dtype fp32 --seed 42 --out runs/tune-wn11-lora/best\n")
    commands, _ = planned(capsys, "methods", "--graph", "wn11", "--seeds", "1", "--methods", "palt,lora")
    assert len(commands) == 2
    lora = commands[1].split(" && ")
    assert lora == ["python train.py --data wn11 --recipe cpu --model minilm --lr 0.000453 --batch 8 --method lora "
                    "--lora-rank 8 --epochs 1 --seed 1 --dtype auto --out runs/wn11-lora-s1",
                    "python evaluate.py --tc --ckpt runs/wn11-lora-s1 --dtype fp32 --out results/methods/wn11-lora-s1.json"]
    assert commands[0].startswith("python train.py --data wn11 --method palt --recipe tuned --epochs 1 --seed 1")
    run = train.parse_args(shlex.split(lora[0])[2:])  # train.py takes it, at the final's budget
    assert (run.method, run.epochs, run.max_steps, run.dev_every, run.seed) == ("lora", 1, None, None, 1)


def test_umls_methods_train_8_epochs_and_rank_once_keeping_the_ranks(results, capsys):
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
