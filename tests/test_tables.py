"""support/tables.py's methods table, verdict and picture, on synthetic finals in a temporary results folder:
the figures they state are the JSONs' own, rows without a final are left out, and the verdict follows the numbers."""
import json

import numpy as np
import pytest

import plot
from support import tables

from conftest import clear_table_caches, study_with

TOTAL = 23_000_000
TUNABLE = {"palt": 600_000, "finetune": 23_000_000, "lora": 150_000, "lora-r48": 590_000, "bitfit": 100_000}


@pytest.fixture
def results(tmp_path, monkeypatch):
    """An empty results folder in place of the project's, the module's caches emptied around it."""
    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    (tmp_path / "methods").mkdir()
    clear_table_caches()
    yield tmp_path
    clear_table_caches()


def final(root, graph, method, seed, figure, epochs=8, wall_s=960.0):
    """results/methods/GRAPH-METHOD-sSEED.json as evaluate.py writes it: UMLS an MRR, WN11 an accuracy (its
    per-triple rights: the first figure x 100 of 100 test triples right)."""
    train = {"method": method, "tunable": TUNABLE[method], "total": TOTAL, "epochs": epochs, "steps": 163 * epochs,
             "batch": 32, "wall_s": wall_s}
    r = {"task": "lp" if graph == "umls" else "tc", "train": train, "checkpoint_bytes": 2_400_000,
         "manifest": {"device": {"cpu": "Test CPU", "threads": 2}}}
    if graph == "umls":
        r["metrics"] = {"filtered": {"both": {"realistic": {"mrr": figure}}}}
    else:
        right = np.arange(100) < round(100 * figure)
        r["metrics"] = {"test_accuracy": figure, "test_right": np.packbits(right).tobytes().hex()}
        r["counts"] = {"test": 100}
    (root / "methods" / f"{graph}-{method}-s{seed}.json").write_text(json.dumps(r))


def umls_ranks(root, method, seed, rank):
    """results/methods/umls-METHOD-sSEED.state: every one of 10 test triples ranked `rank` on both sides."""
    state = root / "methods" / f"umls-{method}-s{seed}.state"
    state.mkdir()
    (state / "settings.json").write_text("{}")
    rows = np.array([(t, s, rank, rank) for t in range(10) for s in (0, 1)])
    np.savez(state / "rank0.npz", rows=rows)


MRR = {("palt", 42): .70, ("palt", 1): .74, ("finetune", 42): .80, ("finetune", 1): .84,
       ("lora", 42): .60, ("lora", 1): .66}


def three_methods(root, seeds=(42, 1)):
    for (method, seed), mrr in MRR.items():
        if seed in seeds:
            final(root, "umls", method, seed, mrr)


def test_the_table_has_a_row_a_method_in_order_with_its_means_counts_and_sizes(results):
    three_methods(results)
    study_with(results / "tune-umls-lora", [(.5, 1e-4), (.6, 9e-4)])
    study_with(results / "tune-umls-lora-lr", [(.61, 2e-3)], low=3e-4, high=1e-2)  # its lr alone
    study_with(results / "tune-umls-finetune", [(.7, 1e-4)])
    text = tables.methods()
    rows = text.splitlines()[2:]
    assert [r.split(" | ")[0].strip("| ") for r in rows] == ["palt", "finetune", "lora"]  # METHODS' order
    palt, finetune, lora = rows
    assert ".720 ± .028 (seeds 42, 1)" in palt and ".820 ± .028 (seeds 42, 1)" in finetune
    assert ".630 ± .042 (seeds 42, 1)" in lora
    assert "600,000 (2.61%)" in palt and "23,000,000 (100.00%)" in finetune and "150,000 (0.65%)" in lora
    assert "| 2.4 |" in palt  # MB
    assert "| UMLS none |" in palt and "| UMLS 1 |" in finetune and "| UMLS 2 + 1 |" in lora  # search trials
    assert "2.0 (Test CPU, 2 threads)" in palt  # 960 s over 8 epochs
    assert "bitfit" not in text and "prompt" not in text  # no finals, no rows
    assert "(the reference)" in finetune and "ranks not kept" in palt  # no .state folders yet
    assert palt.endswith("| (the reference) |") and "ranks not kept" in lora.split(" | ")[-1]  # the gaps to PALT


def test_lora_at_palts_count_is_a_row_after_lora_whose_search_is_loras(results):
    three_methods(results)
    final(results, "umls", "lora-r48", 42, .75)
    study_with(results / "tune-umls-lora", [(.5, 1e-4), (.6, 9e-4)])
    rows = tables.methods().splitlines()[2:]
    assert [r.split(" | ")[0].strip("| ") for r in rows] == ["palt", "finetune", "lora", "lora-r48"]
    assert "590,000 (2.57%)" in rows[3] and "| UMLS 2 |" in rows[3] and ".750 (seed 42)" in rows[3]


def test_the_paired_gaps_read_the_kept_ranks_and_the_wn11_rights(results):
    three_methods(results)
    umls_ranks(results, "finetune", 42, 1)  # MRR 1 on every triple
    umls_ranks(results, "palt", 42, 2)  # MRR .5
    final(results, "wn11", "palt", 42, .85)
    final(results, "wn11", "finetune", 42, .90)
    umls_ranks(results, "lora", 42, 4)  # MRR .25
    palt, _, lora = tables.methods().splitlines()[2:]
    assert "UMLS s42: -.500 [-.500, -.500] (10)" in palt
    assert "WN11 s42: -5.00 [" in palt and "85.00 (seed 42)" in palt
    assert "UMLS s42: -.500 [-.500, -.500] (10) (each 8 epochs, 41.7k positives)" in palt
    to_finetune, to_palt = lora.split(" | ")[-2:]
    assert "UMLS s42: -.750 [-.750, -.750] (10)" in to_finetune and "UMLS s42: -.250 [-.250, -.250] (10)" in to_palt


def test_the_budgets_beside_the_gaps_are_said_once_when_alike_and_seed_by_seed_when_not(results):
    for seed in (42, 1):
        final(results, "wn11", "palt", seed, .85, epochs=1)
        final(results, "wn11", "finetune", seed, .88, epochs=1)
    final(results, "wn11", "lora", 42, .84, epochs=1)
    final(results, "wn11", "lora", 1, .84, epochs=2)  # twice PALT's positives on this seed
    palt, finetune, lora = tables.methods().splitlines()[2:]
    assert palt.split(" | ")[-2].endswith("s1: -3.00 [-7.00, +0.00] (each 1 epoch, 5.2k positives)")  # said once
    assert ("(s42: each 1 epoch, 5.2k positives; s1: 2 epochs, 10.4k positives against 1 epoch, 5.2k positives)"
            in lora.split(" | ")[-1])


def test_without_finals_the_block_is_one_sentence_and_the_verdict_names_what_is_missing(results):
    assert tables.methods().count("\n") == 0 and "results/methods/" in tables.methods()
    verdict = tables.methods_verdict()
    assert "awaits `umls-palt-sS`, `umls-finetune-sS`, `wn11-palt-s42`" in verdict
    assert "`umls-lora-sS`" in verdict and "`wn11-bitfit-s42`" in verdict


def test_one_graphs_finals_give_its_answers_and_the_verdict_names_what_the_other_awaits(results):
    for method, acc in {"palt": .86, "finetune": .89, "lora": .87, "bitfit": .84}.items():
        final(results, "wn11", method, 42, acc, epochs=1)
    verdict = tables.methods_verdict()
    assert "The paper's claim at equal budgets: on WN11 PALT is not within 1.00 points of finetuning" in verdict
    assert "on UMLS" not in verdict
    assert "at equal budgets on the other graph awaits `umls-palt-sS`, `umls-finetune-sS`." in verdict
    assert ("PALT (600k tunable) against the general methods: LoRA (150k tunable): PALT does not beat it on WN11 "
            "(86.00 against 87.00); BitFit (100k tunable): PALT beats it on WN11 (86.00 against 84.00).") in verdict
    assert ("Whether PALT beats the general methods at every seed on both graphs awaits `umls-palt-sS`, `umls-lora-sS`, "
            "`umls-lora-r48-sS`, `wn11-lora-r48-s42`, `umls-bitfit-sS`.") in verdict


def test_a_method_with_fewer_seeds_than_palt_is_answered_at_the_seeds_both_hold(results):
    for seed, acc in {42: .86, 1: .90}.items():
        final(results, "wn11", "palt", seed, acc, epochs=1)
        final(results, "wn11", "finetune", seed, acc + .03, epochs=1)
    final(results, "wn11", "lora", 42, .85, epochs=1)  # below PALT's seed 42, above its mean of 88.00
    final(results, "wn11", "bitfit", 1, .91, epochs=1)  # above PALT's seed 1
    verdict = tables.methods_verdict()
    assert "on WN11 PALT is not within 1.00 points of finetuning (88.00 against 91.00" in verdict
    assert "LoRA (150k tunable): PALT beats it on WN11 (86.00 against 85.00, seed 42 alone)" in verdict
    assert "BitFit (100k tunable): PALT does not beat it on WN11 (90.00 against 91.00, seed 1 alone)" in verdict
    assert "LoRA at PALT's count" not in verdict.split("Whether PALT beats")[0]  # no final, no answer
    awaited = verdict.split("Whether PALT beats the general methods at every seed on both graphs awaits ")[1]
    assert "`wn11-lora-s1`" in awaited and "`wn11-bitfit-s42`" in awaited and "`wn11-lora-r48-sS`" in awaited


def test_readmes_sentence_gives_each_graphs_finals_and_names_a_graph_without_any(results):
    assert tables.readme_methods().endswith(": UMLS awaits its finals; WN11 awaits its finals.")
    for seed, acc in {42: .86, 1: .90}.items():
        final(results, "wn11", "palt", seed, acc, epochs=1)
    final(results, "wn11", "lora", 42, .85, epochs=1)
    clear_table_caches()
    said = tables.readme_methods()
    assert ("UMLS awaits its finals; WN11 test accuracy (1 epoch, 5.2k positives each): PALT 88.00 ± 2.83 "
            "(seeds 42, 1), LoRA 85.00 (seed 42).") in said
    final(results, "wn11", "bitfit", 42, .80, epochs=2)  # twice the others' positives
    clear_table_caches()
    assert "WN11 test accuracy (unequal budgets): PALT" in tables.readme_methods()

def test_the_verdict_follows_the_numbers(results):
    for method, mrrs in {"palt": (.80, .81, .82), "finetune": (.805, .815, .825), "lora": (.70, .71, .72),
                         "bitfit": (.60, .61, .62)}.items():
        for seed, mrr in zip(tables.SEEDS, mrrs):
            final(results, "umls", method, seed, mrr)
    for method, acc in {"palt": .88, "finetune": .885, "lora": .86, "lora-r48": .89, "bitfit": .84}.items():
        final(results, "wn11", method, 42, acc)
    for seed in tables.SEEDS:
        final(results, "umls", "lora-r48", seed, .79)
    close = tables.methods_verdict()
    assert "on UMLS PALT is within .010 MRR of finetuning (.810 against .815, finetuning +.005" in close
    assert "on WN11 PALT is within 1.00 points" in close and "equal budgets: 8 epochs, 41.7k positives each" in close
    assert "LoRA (150k tunable): PALT beats it on UMLS (.810 against .710) and beats it on WN11" in close
    assert ("LoRA at PALT's count (rank 48) (590k tunable): PALT beats it on UMLS (.810 against .790) and does not "
            "beat it on WN11 (88.00 against 89.00)") in close
    assert "awaits" not in close
    tables.result.cache_clear()
    final(results, "umls", "finetune", 42, .95)  # finetuning now far ahead on one seed
    final(results, "wn11", "lora", 42, .95)  # and LoRA ahead on WN11
    apart = tables.methods_verdict()
    assert apart != close and "on UMLS PALT is not within .010 MRR" in apart
    assert "does not beat it on WN11 (88.00 against 95.00)" in apart


def test_plot_methods_draws_a_png_from_the_same_finals(results, tmp_path_factory, capsys):
    pytest.importorskip("matplotlib")
    three_methods(results)
    out = tmp_path_factory.mktemp("figures") / "methods.png"
    plot.main(["methods", "--out", str(out)])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    said = capsys.readouterr().out
    assert "lora: 150,000 tunable parameters, UMLS test MRR 0.6300 ± 0.0424 (seeds 42, 1)" in said
    assert "WN11" not in said  # no WN11 finals: no WN11 panel


def test_plot_methods_draws_a_panel_a_graph_and_wn11_alone(results, tmp_path_factory, capsys):
    pytest.importorskip("matplotlib")
    final(results, "wn11", "palt", 42, .88)
    final(results, "wn11", "lora", 42, .86)
    out = tmp_path_factory.mktemp("figures") / "methods.png"
    plot.main(["methods", "--out", str(out)])
    said = capsys.readouterr().out
    assert "lora: 150,000 tunable parameters, WN11 test accuracy (points) 86.0000 ± 0.0000 (seeds 42)" in said
    assert "UMLS" not in said
    three_methods(results)
    tables.result.cache_clear()
    plot.main(["methods", "--out", str(out)])
    said = capsys.readouterr().out
    assert "UMLS test MRR" in said and "WN11 test accuracy" in said


def test_plot_methods_without_finals_says_so_in_one_line(results):
    with pytest.raises(SystemExit, match=r"^error: no finals .* nothing to draw$"):
        plot.main(["methods", "--out", "x.png"])


def test_the_speed_figures_are_parsed_from_their_logs_and_a_log_not_understood_names_its_file(results):
    (results / "speed-train-x.log").write_text("recipe  batch seq/step compiled seq/s real tok/s TFLOP/s share\n"
                                               "cpu:today   32   128   today   316   4,091   0.17   24.0% of 0.73\n"
                                               "cpu         32   128   eager   506   6,546   0.28   38.4% of 0.73\n")
    assert tables.log_figures("speed-train-x.log") == "cpu:today 316, cpu 506 seq/s"
    (results / "speed-auto-x.log").write_text("  UMLS training step (2 x 32+96 seq)   118.8   4.1   seq/s   0.03x\n"
                                              "  UMLS ranking (4 queries x 135)   294.2   45.8  triples/s   0.16x\n")
    assert tables.log_figures("speed-auto-x.log") == ("step fp32 118.8, bf16 4.1 seq/s; "
                                                      "ranking fp32 294.2, bf16 45.8 triples/s")
    (results / "speed-rank-x.log").write_text("a log of another format\n")
    with pytest.raises(tables.SpeedLogError, match="speed-rank-x.log: no 'ours"):
        tables.log_figures("speed-rank-x.log")
    assert tables.log_figures("profile-x.log") == ""  # a link only


def table4_final(root, variant, seed, figure, tunable=600_000):
    """results/table4/wn11-VARIANT-sSEED.json as `evaluate.py --tc` writes it: the first figure x 100 of 100 test
    triples right."""
    (root / "table4").mkdir(exist_ok=True)
    right = np.arange(100) < round(100 * figure)
    r = {"task": "tc", "train": {"tunable": tunable, "total": TOTAL, "epochs": 1},
         "metrics": {"test_accuracy": figure, "test_right": np.packbits(right).tobytes().hex()}, "counts": {"test": 100}}
    (root / "table4" / f"wn11-{variant}-s{seed}.json").write_text(json.dumps(r))


def test_table4_has_a_row_a_variant_in_the_papers_order_with_its_mean_and_paired_gap(results):
    # Written out of order, with a seed-1-only variant and a run of another ranking beside them.
    table4_final(results, "finetune", 42, .90, tunable=TOTAL)
    table4_final(results, "finetune", 1, .92, tunable=TOTAL)
    table4_final(results, "probe", 2, .70, tunable=1_000)
    table4_final(results, "nowp", 1, .82)
    table4_final(results, "nowp", 42, .80)
    table4_final(results, "nocalib-mid", 42, .83)
    table4_final(results, "nocalib", 42, .75)
    table4_final(results, "palt", 1, .87)
    table4_final(results, "palt", 42, .85)
    (results / "table4" / "wn11-palt-s42-lp660.json").write_text("{}")  # not a final: never read
    rows = tables.table4().splitlines()[2:]
    labels = [r.split(" | ")[0].strip("| ") for r in rows]
    assert labels == ["PALT", "w/o W_p", "w/o calibration at the middle (layer 3)", "w/o calibration at both",
                      "w/o the encoder (probe)", "finetuning"]
    palt, nowp, mid, both, probe, finetune = rows
    assert "| 42, 1 | 86.00 ± 1.41 |" in palt and "(the reference)" in palt and "600,000 (2.61%)" in palt
    # A gap a seed both have: 80 of the 85 PALT got right on seed 42, 82 of its 87 on seed 1.
    assert "| 42, 1 | 81.00 ± 1.41 |" in nowp and "| s42: -5.00 [" in nowp and "; s1: -5.00 [" in nowp
    assert "| s42: -2.00 [" in mid and "s1:" not in mid and "| s42: -10.00 [" in both
    assert "| 2 | 70.00 |" in probe and "no seed shared with PALT" in probe and "1,000 (0.00%)" in probe
    assert "| 42, 1 | 91.00 ± 1.41 |" in finetune and "| s42: +5.00 [" in finetune and "; s1: +5.00 [" in finetune
    assert "23,000,000 (100.00%)" in finetune
    assert "`table4/wn11-finetune-sS`" in finetune


def test_table4_without_runs_is_one_sentence_naming_the_folder_and_every_rows_flags(results):
    said = tables.table4()
    assert "\n" not in said and said.startswith("Table 4's runs at a real budget have not been made yet")
    assert "`results/table4/`" in said and "wn11-VARIANT-sSEED.json" in said and "bench/finals.py table4" in said
    assert "--out runs/table4-VARIANT-sSEED" in said and "--dtype fp32 --out results/table4/wn11-VARIANT-sSEED.json" in said
    for label, flags in tables.TABLE4.values():
        assert f"{label} `{flags}`" in said


def test_the_second_search_sentence_says_where_each_best_lr_lies_and_whether_the_best_moved(results):
    said = tables.second_searches()
    assert said == ""  # no search yet
    study_with(results / "tune-umls-finetune", [(.84, 2.49e-4), (.80, 1e-4)], low=1e-5, high=3e-4)
    study_with(results / "tune-wn11-finetune", [(.83, 2.4e-4)], low=1e-5, high=3e-4)
    study_with(results / "tune-wn11-lora", [(.81, 2.9e-3), (.80, 1e-4)], low=1e-5, high=3e-3)  # at the top
    study_with(results / "tune-wn11-bitfit", [(.79, 1e-4)], low=1e-5, high=3e-3)  # halfway up
    said = tables.second_searches()
    assert "On UMLS, each search's best lr: finetuning 0.000249 (95% of the way from 1e-05 to 0.0003)." in said
    assert "LoRA 0.0029 (99% of the way from 1e-05 to 0.003); BitFit 0.0001 (40% of the way" in said
    assert said.count("has no trial trained in full yet") == 3  # finetuning twice and LoRA; not BitFit
    assert "BitFit's lr searched again" not in said
    study_with(results / "tune-umls-finetune-lr", [(.83, 6e-4), (.845, 4e-4)], low=1e-4, high=1e-3)
    study_with(results / "tune-wn11-lora-lr", [(.80, 9e-3)], low=1e-3, high=3e-2)
    said = tables.second_searches()
    assert ("Finetuning's best moved (+0.0050) with its lr searched again up to 0.001 (`tune-umls-finetune-lr`): 0.8450 at lr "
            "0.0004 (2 trials) against 0.8400.") in said
    assert ("LoRA's best did not move with its lr searched again up to 0.03 (`tune-wn11-lora-lr`): 0.8000 at lr 0.009 "
            "(1 trial) against 0.8100") in said
