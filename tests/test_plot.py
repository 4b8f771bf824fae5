"""plot.py: the attention weights it draws are the ones each layer of PALT's own forward applies, its layers are
numbered as PALT numbers them, train logs parse as train.py writes them, the pictures are real PNGs named after what
they draw, and bad input is one line that writes nothing."""
import argparse
import importlib.util
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import make_bert_dir, write_tiny_kg

import data
from support import checkpoints, graphs
import evaluate
import palt
import plot

ROOT = Path(__file__).resolve().parents[1]
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
needs_matplotlib = pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib (optional) is absent")
PROMPTS = (2, 1, 1)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny graph (umls-like), a tiny BERT with an NSP head, one without, and a PALT checkpoint
    whose prompts, W_p and calibration are all non-zero (so every part of the forward counts)."""
    root = tmp_path_factory.mktemp("plot")
    words = write_tiny_kg(root / "data", "umls")
    base = make_bert_dir(root / "bert", words, layers=3, heads=2)
    headless = make_bert_dir(root / "headless", words, nsp=False, layers=3, heads=2)
    cfg = palt.PaltConfig(prompts=PROMPTS, calib_layers=(1, 2))
    model, loaded = palt.build_palt(str(base), cfg)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in (model.W_p.weight, model.W_c["1"].weight, model.W_c["2"].weight):
            p.add_(torch.randn_like(p) * 0.1)
    kg = graphs.load_kg("umls", root / "data")
    meta = {"model": str(base), "weights_sha256": loaded.weights_sha256, "data": "umls",
            "data_fingerprint": kg.fingerprint, "text": "name", "prompts": list(PROMPTS),
            "max_seq_length": 64}
    ckpt = root / "palt.safetensors"
    checkpoints.save_checkpoint(ckpt, model, meta)
    return {"data": root / "data", "words": words, "ckpt": ckpt, "headless": headless, "model": model.eval(),
            "kg": kg, "enc": data.encode(kg, loaded.tokenizer), "tokenizer": loaded.tokenizer}


def padded_batch(tiny):
    """Two triples with prompts; the second row's last two positions masked out, as padding is."""
    batch = data.build_batch(tiny["enc"], [(0, 0, 1), (2, 1, 4)], PROMPTS, 64)
    batch["attention_mask"][1, -2:] = 0
    return batch


def heads(layer, h):
    """q, k, v (B, n_head, L, d_head) of a layer on its input h, as its attention makes them."""
    B, L, H = h.shape
    return (x(h).view(B, L, layer.n_head, H // layer.n_head).transpose(1, 2)
            for x in (layer.q, layer.k, layer.v))


def png_width(path):
    """A PNG's width in pixels, from its IHDR chunk (after the signature, the chunk's length and
    type)."""
    raw = Path(path).read_bytes()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">I", raw[16:20])[0]


def one_line_error(argv):
    """The message of plot.main(argv)'s SystemExit, checked to be a single line."""
    with pytest.raises(SystemExit) as e:
        plot.main([str(a) for a in argv])
    message = e.value.code
    assert isinstance(message, str) and "\n" not in message, message
    return message


# ------------------------------------------------------------------------- the attention weights
def recorded_forward(model, batch, monkeypatch):
    """(PALT.forward's logits and weights with return_attention=True, [(each layer's input h, mask, weights) as its
    attention sublayer saw and returned them]): each layer's attention wrapped, here in the test, to record."""
    seen = []
    for layer in model.bert.layers:
        def recording(h, mask, weights=False, original=layer.attention):
            out = original(h, mask, weights)
            seen.append((h, mask, out[1]))
            return out
        monkeypatch.setattr(layer, "attention", recording)
    with torch.no_grad():
        logits, weights = model(**batch, return_attention=True)
    return logits, weights, seen


def test_weights_at_v_are_each_layers_sdpa_output(tiny, monkeypatch):
    model, batch = tiny["model"], padded_batch(tiny)
    _, weights, seen = recorded_forward(model, batch, monkeypatch)
    assert len(weights) == len(seen) == model.bert.config.num_hidden_layers
    for layer, (h, mask, w), drawn in zip(model.bert.layers, seen, weights):
        assert drawn is w  # the forward hands back what each layer's attention computed
        B, L, H = h.shape
        q, k, v = heads(layer, h)
        torch.testing.assert_close(w @ v, F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                                   atol=1e-5, rtol=0)
        # the layer's whole attention sublayer, computed with these weights, is what it computes
        merged = (w @ v).transpose(1, 2).reshape(B, L, H)
        with torch.no_grad():
            out, none = layer.attention(h, mask)
            torch.testing.assert_close(layer.ln1(h + layer.attn_out(merged)), out, atol=1e-5, rtol=0)
        assert none is None  # the default path computes no weights
        torch.testing.assert_close(w.sum(-1), torch.ones(B, layer.n_head, L))
        assert (w[1, :, :, -2:] == 0).all()  # padding is never attended


def test_asking_for_the_weights_leaves_the_models_score_as_it_is(tiny):
    model, batch = tiny["model"], padded_batch(tiny)
    with torch.no_grad():
        logits, _ = model(**batch, return_attention=True)
        torch.testing.assert_close(logits, model(**batch), atol=0, rtol=0)


def test_layers_count_from_0_as_palt_and_calib_count_them():
    assert [plot.layer_list(t) for t in ("0", "5,3,0", "3,3")] == [[0], [0, 3, 5], [3]]
    with pytest.raises(argparse.ArgumentTypeError, match="from 0"):
        plot.layer_list("-1")


@needs_matplotlib
def test_the_default_layers_are_the_first_and_the_ones_palt_calibrates_titled_from_0(tiny, tmp_path):
    six = make_bert_dir(tmp_path / "six", tiny["words"], layers=6, heads=2)  # MiniLM's depth
    model, loaded = palt.build_palt(str(six), palt.PaltConfig(prompts=PROMPTS))
    assert model.calib_layers == (3, 5)  # PALT's middle and last
    src = plot.Source("six", "six", model.eval(), tiny["kg"], loaded.tokenizer, PROMPTS, 64)
    view = plot.triple_view(src, "e0", "r0", "e1", None)
    assert view["layers"] == [0, 3, 5]
    plt = plot.need_pyplot()
    fig = plot.draw_attention(plt, [view], [src])
    titles = [ax.get_title().splitlines()[-1] for ax in fig.axes if ax.get_title()]
    plt.close(fig)
    assert titles == ["layer 0 of 0..5: attention of [CLS] per head",
                      "layer 3 of 0..5, calibrated after it: attention of [CLS] per head",
                      "layer 5 of 0..5, calibrated after it: attention of [CLS] per head"]


def test_tokens_are_labelled_by_part(tiny):
    src = plot.Source("tiny", "tiny", tiny["model"], tiny["kg"], tiny["tokenizer"], PROMPTS, 64)
    view = plot.triple_view(src, "e0", "r0", "e1", None)
    assert view["labels"][:3] == ["[CLS]", "P1", "P2"]
    assert view["parts"] == ["[CLS]", "prompt", "prompt", "head", "head", "relation", "prompt",
                             "[SEP]", "tail", "tail", "prompt", "[SEP]"]
    assert view["layers"] == [0, 1, 2] and view["weights"].shape == (3, 2, 12, 12)
    assert view["text"] == "(w0 w0, rel0, w1 w3)" and view["token"] == 0


# ------------------------------------------------------------------------- train logs
LOG = """\
epoch 1/2 step 20/80 loss 0.6500 lr 1.00e-04 seq/s 100 padded/real 1.10 fp32 eta 1.0m
dev at step 20 (epoch 0.5): mrr 0.2000
epoch 1/2 step 40/80 loss 0.6000 lr 1.00e-04 seq/s 100 padded/real 1.10 fp32 eta 1.0m
dev after epoch 1: mrr 0.3000, MR 9.00, Hits@10 0.5000 on 30 dev triples against 24 candidates \
(best so far)
epoch 2/2 step 60/80 loss 0.5000 lr 1.00e-04 seq/s 100 padded/real 1.10 fp32 eta 1.0m
stopped at step 65 (SIGINT; 1.2 min of steps): runs/x/ckpt.safetensors holds this step's weights; --resume ...
resumed from runs/x/state.safetensors: epoch 1, step 50, on AMD EPYC (family 25 model 1), 2 threads x 1
epoch 2/2 step 60/80 loss 0.4800 lr 1.00e-04 seq/s 100 padded/real 1.10 fp32 eta 1.0m
dev at step 60 (epoch 1.5): mrr 0.2800, MR 8.00, Hits@10 0.6000 on 30 dev triples (stratified \
estimate, 9 candidates scored a query)
epoch 2/2 step 80/80 loss 0.4500 lr 1.00e-04 seq/s 100 padded/real 1.10 fp32 eta 0.0m
dev after epoch 2: mrr 0.3500, MR 7.00, Hits@10 0.7000 on 30 dev triples (stratified estimate, \
9 candidates scored a query) (best so far)
"""


def test_the_parser_reads_what_train_py_writes():
    c = plot.parse_log(LOG, "x")
    assert c.total == 80
    assert c.loss == [(20, 0.65), (40, 0.6), (60, 0.48), (80, 0.45)]  # 60 again after the resume
    assert [(d["step"], d["value"]) for d in c.dev] == [(20, .2), (40, .3), (60, .28), (80, .35)]
    # 'dev after epoch 1' is at the epoch's last logged step
    assert c.dev[1] == {"step": 40, "epoch": 1.0, "mrr": 0.3, "mr": 9.0, "hits@10": 0.5,
                        "metric": "mrr", "value": 0.3, "kind": "all"}
    assert c.kind() == "estimate"
    assert c.dev[0]["kind"] == "estimate"  # a line that does not say: as the run's last one
    assert c.restarts == [40, 50]  # the logged mean starts again at epoch 2 and at the resume
    steps, losses = c.loss_line()
    assert steps == [20, 40, 60, 60, 80] and losses[2] != losses[2]  # a NaN breaks the line


@pytest.mark.parametrize("name", ["signal", "inverse rank"])  # before 2026-12-07 the inverse rank was "signal"
def test_a_big_graphs_estimate_reads_as_an_inverse_rank_not_an_mrr(name):
    """Since 2026-11-29 a stratified dev estimate logs MR and an inverse rank (1 / the estimated rank, above the MRR),
    no MRR: the curve plots it under its own name."""
    log = ("epoch 1/1 step 20/20 loss 0.7000 lr 1e-4\n"
           f"dev after epoch 1: {name} 0.2464, MR 504.73 on 50 dev triples (stratified estimate, 170 candidates scored a "
           "query: MR unbiased; the signal, the mean of 1 / an estimated rank, orders checkpoints as the exact MRR does "
           "but runs ~2x it: not an MRR) (best so far)\n")
    (d,) = plot.parse_log(log, "fb").dev
    assert d == {"step": 20, "epoch": 1.0, "mr": 504.73, "inverse_rank": 0.2464, "metric": "inverse_rank", "value": 0.2464,
                 "kind": "estimate"}


def test_accuracy_logs_and_a_new_run_appended_to_an_old_log():
    log = ("epoch 1/1 step 20/40 loss 0.7000 lr 1e-4\n"
           "epoch 1/1 step 40/40 loss 0.6000 lr 1e-4\n"
           "dev after epoch 1: accuracy 0.8100 (best so far)\n"
           "epoch 1/1 step 20/40 loss 0.5000 lr 1e-4\n"  # the folder trained again, no --resume
           "dev at step 20 (epoch 0.5): accuracy 0.8300\n")
    c = plot.parse_log(log, "tc")
    assert c.loss == [(20, 0.5)]
    assert [(d["step"], d["value"], d["kind"]) for d in c.dev] == [(20, 0.83, "accuracy")]


def test_a_run_folder_is_named_after_itself_and_a_log_after_its_file(tmp_path):
    (tmp_path / "umls-run").mkdir()
    (tmp_path / "umls-run" / "log.txt").write_text(LOG)
    (tmp_path / "palt-umls-minilm.train.log").write_text(LOG)
    assert plot.read_curve(tmp_path / "umls-run").name == "umls-run"
    assert plot.read_curve(tmp_path / "palt-umls-minilm.train.log").name == "palt-umls-minilm"


def test_the_shipped_adapters_train_logs_parse():
    logs = sorted((ROOT / "results").glob("palt-*-minilm.train.log"))
    if not logs:
        pytest.skip("no shipped adapter's train log in results/")
    for path in logs:
        c = plot.read_curve(path)
        assert c.dev and c.loss[-1][0] <= c.total and c.dev[-1]["step"] <= c.total, path


# ------------------------------------------------------------------------- pictures
@needs_matplotlib
def test_attention_png_beside_a_plain_model_named_after_the_triple_by_default(tiny, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    plot.main(["attention", "--data", "umls", "--data-dir", str(tiny["data"]), "--ckpt",
               str(tiny["ckpt"]), "--compare", str(tiny["headless"]), "w0 w0", "rel0", "text:a/b c"])
    assert capsys.readouterr().out.splitlines()[-1] == "wrote attention-w0_w0-rel0-text_a_b_c.png"
    assert [p.name for p in tmp_path.iterdir()] == ["attention-w0_w0-rel0-text_a_b_c.png"]
    assert png_width(tmp_path / "attention-w0_w0-rel0-text_a_b_c.png") >= 800


@needs_matplotlib
def test_whole_matrices_and_a_prompt_tokens_row(tiny, tmp_path):
    for flags, name in ((["--matrices"], "m.png"), (["--token", "P1", "--layers", "0,2"], "p.png")):
        plot.main(["attention", "--data-dir", str(tiny["data"]), "--ckpt", str(tiny["ckpt"]),
                   "e0", "r0", "e1", "--out", str(tmp_path / name), *flags])
        assert png_width(tmp_path / name) >= 800


@needs_matplotlib
def test_curves_png_of_several_runs_and_write_curve(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "log.txt").write_text(LOG)
    (tmp_path / "other.train.log").write_text(LOG.replace("0.3500", "0.4000"))
    out = tmp_path / "curves.png"
    plot.main(["curve", str(run), str(tmp_path / "other.train.log"), "--names", "a,b",
               "--out", str(out)])
    assert png_width(out) >= 800
    monkeypatch.chdir(run)  # without --out: named after the runs, in the current folder
    plot.main(["curve", str(run), str(tmp_path / "other.train.log")])
    assert capsys.readouterr().out.splitlines()[-1] == "wrote curve-run+other.png"
    assert png_width(run / "curve-run+other.png") >= 800
    assert plot.write_curve(run) == run / "curve.png" and png_width(run / "curve.png") >= 800
    assert plot.write_curve(tmp_path / "no-run") is None and not (tmp_path / "no-run").exists()


def write_metrics(folder, tensorboard=False):
    """A run's metrics.jsonl as runlog.Metrics writes it: two epochs of 4 steps logged every 2, a dev point at each
    epoch's end, stopped after step 6 and resumed from step 4 (steps 5 and 6 done again, their loss lower)."""
    from support import runlog
    folder.mkdir(exist_ok=True)
    metrics = runlog.Metrics(folder, tensorboard=tensorboard)
    train = lambda step, loss: {"kind": "train", "step": step, "total_steps": 8, "epoch": 1 + (step - 1) // 4,
                                "loss": loss, "lr": 1e-3, "seq_per_s": 50.0, "padded_per_real": 1.1, "eta_min": 0.1}
    dev = lambda step, mrr: {"kind": "dev", "step": step, "epoch": step / 4, "metric": "mrr", "value": mrr, "mr": 3.0,
                             "hits@10": 0.9, "triples": 5, "candidates": 20, "sampled": False, "estimate": False}
    records = [{"kind": "start", "step": 0}, train(2, 0.69), train(4, 0.6), dev(4, 0.3), train(6, 0.9),
               {"kind": "start", "step": 4}, train(6, 0.5), train(8, 0.4), dev(8, 0.5)]
    for r in records:
        metrics.write(r)
    return metrics


def test_metrics_jsonl_of_a_resumed_run_reads_back_as_its_curve(tmp_path, capsys):
    write_metrics(tmp_path / "run")
    (tmp_path / "run" / "log.txt").write_text("epoch 1/2 step 2/8 loss 9.0000 lr 1e-3\n")  # metrics.jsonl comes first
    c = plot.read_curve(tmp_path / "run")
    assert c.name == "run" and c.total == 8
    assert c.loss == [(2, 0.69), (4, 0.6), (6, 0.5), (8, 0.4)]  # the first step 6 was done again after the resume
    assert [(d["step"], d["value"], d["kind"]) for d in c.dev] == [(4, 0.3, "all"), (8, 0.5, "all")]
    steps, losses = c.loss_line()
    assert steps == [2, 4, 6, 6, 8] and losses[2] != losses[2]  # the epoch's new mean (and the resume) break the line
    out = tmp_path / "c.png"
    plot.main(["curve", str(tmp_path / "run"), "--out", str(out)])
    assert capsys.readouterr().out.splitlines()[0] == "run: 4 loss points to step 8 of 8, 2 dev points, best mrr 0.5000 at step 8"
    assert png_width(out) >= 800
    from support import picture
    assert picture.write_curve(tmp_path / "run") == tmp_path / "run" / "curve.png"
    assert png_width(tmp_path / "run" / "curve.png") >= 600


def test_a_damaged_metrics_file_is_one_line(tmp_path):
    write_metrics(tmp_path / "run")
    with open(tmp_path / "run" / "metrics.jsonl", "a") as f:
        f.write('{"kind": "train"\n')
    message = one_line_error(["curve", tmp_path / "run", "--out", tmp_path / "c.png"])
    assert message == f"error: {tmp_path / 'run' / 'metrics.jsonl'}:10: not a record of train.py's metrics file"


def test_tensorboard_event_files_hold_the_metrics_and_without_the_package_one_line(tmp_path, monkeypatch):
    from support import runlog
    from support.errors import FlagError
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    write_metrics(tmp_path / "run", tensorboard=True).board.close()
    events = EventAccumulator(str(tmp_path / "run"))
    events.Reload()
    assert [(e.step, round(e.value, 4)) for e in events.Scalars("train/loss")] == [(2, 0.69), (4, 0.6), (6, 0.9),
                                                                                   (6, 0.5), (8, 0.4)]
    assert [(e.step, round(e.value, 4)) for e in events.Scalars("dev/mrr")] == [(4, 0.3), (8, 0.5)]
    assert "dev/triples" not in events.Tags()["scalars"]
    runlog.check_tensorboard()  # installed: no error
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # `import torch.utils.tensorboard`: ImportError
    with pytest.raises(FlagError, match="^--tensorboard needs the tensorboard package: pip install tensorboard$"):
        runlog.check_tensorboard()


# ------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("args, what", [(["nowhere", "r0", "e1"], "no entity 'nowhere'"),
                                        (["e0", "r9", "e1"], "no relation 'r9'"),
                                        (["e0", "r0", "e1", "--layers", "3"], "--layers 3: palt has layers 0 to 2"),
                                        (["e0", "r0", "e1", "--token", "P9"], "--token P9: ")])
def test_a_bad_entity_relation_layer_or_token_is_one_line_and_writes_nothing(tiny, tmp_path, args,
                                                                            what):
    out = tmp_path / "a.png"
    message = one_line_error(["attention", "--data-dir", tiny["data"], "--ckpt", tiny["ckpt"],
                              *args, "--out", out])
    assert message.startswith("error: ") and what in message, message
    assert not out.exists()


def test_a_bad_path_is_one_line_and_writes_nothing(tiny, tmp_path):
    out = tmp_path / "a.png"
    (tmp_path / "empty.log").write_text("nothing here\n")
    attention = ["attention", "--data-dir", tiny["data"]]
    cases = [([*attention, "--ckpt", tmp_path / "gone.safetensors", "e0", "r0", "e1"],
              "gone.safetensors: no such checkpoint"),
             ([*attention, "--ckpt", tiny["ckpt"], "--compare", tmp_path / "x", "e0", "r0", "e1"],
              "no such checkpoint, run folder or base model"),
             ([*attention, "--data", tmp_path / "gone", "e0", "r0", "e1"], "neither a benchmark"),
             (["curve", tmp_path / "missing.log"], "missing.log: no such run folder or train log"),
             (["curve", tmp_path], "a folder without log.txt"),
             (["curve", tmp_path / "empty.log"], "no training lines")]
    for argv, what in cases:
        message = one_line_error([*argv, "--out", out])
        assert message.startswith("error: ") and what in message, message
        assert not out.exists()


def test_without_matplotlib_one_line_saying_pip_install_and_no_curve_png(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib`: ImportError
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    (tmp_path / "log.txt").write_text(LOG)
    out = tmp_path / "c.png"
    message = one_line_error(["curve", tmp_path, "--out", out])
    assert message == "plot.py needs matplotlib: pip install matplotlib"
    assert not out.exists()
    assert plot.write_curve(tmp_path) is None and not (tmp_path / "curve.png").exists()


def test_plot_imports_without_matplotlib_and_never_imports_train():
    code = ("import sys; sys.modules['matplotlib'] = None; import plot; "
            "assert 'train' not in sys.modules and 'matplotlib.pyplot' not in sys.modules")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=ROOT)


# ------------------------------------------------------------------------- the shipped adapter
@pytest.mark.slow
def test_the_papers_wn11_example_on_the_shipped_adapter(monkeypatch):
    """(evening clothes, type of, attire): the score with the weights asked for is the Scorer's, and each layer's
    weights @ v is its SDPA output."""
    data_dir = os.environ.get("PALT_DATA") or str(ROOT.parent / "shared" / "data")
    if not Path(data_dir, "WN11").is_dir():
        pytest.skip(f"no WN11 data in {data_dir}")
    model, meta, loaded = checkpoints.load_checkpoint(ROOT / "weights" / "palt-wn11-minilm.safetensors")
    kg = graphs.load_kg("wn11", data_dir, meta["text"])
    enc = data.encode(kg, loaded.tokenizer)
    triple = [kg.entities.index("__evening_clothes_1"), kg.relations.index("_type_of"),
              kg.entities.index("__attire_1")]
    batch = data.build_batch(enc, [triple], meta["prompts"], meta["max_seq_length"])
    scorer = evaluate.Scorer(model, enc, meta["prompts"], meta["max_seq_length"])
    expected = scorer([triple])
    logits, _, seen = recorded_forward(model.eval(), batch, monkeypatch)
    torch.testing.assert_close(palt.score(logits), expected, atol=1e-4, rtol=0)
    for layer, (h, mask, w) in zip(model.bert.layers, seen):
        q, k, v = heads(layer, h)
        torch.testing.assert_close(w @ v, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), atol=1e-5, rtol=0)
