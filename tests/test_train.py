"""train.py: training lowers the loss, frozen tensors stay frozen, DDP equals one process, --resume replays exactly."""
import importlib.util, json, os, re, shutil, signal, subprocess, sys
from pathlib import Path
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import data, evaluate, plot, train
from support import checkpoints, devices, evalcli, flags, graphs, runlog
from support.files import OutputError
from support.flags import FlagError
from support.hub import load_bert
from conftest import make_bert_dir, signal_at_step, write_tiny_kg

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    words = write_tiny_kg(root / "data", "umls")
    write_tiny_kg(root / "data", "WN11")
    return root, make_bert_dir(root / "bert", words, layers=2), make_bert_dir(root / "headless", words, nsp=False)


def args(setup, out, *extra, data="umls"):
    root, base, _ = setup
    return ["--data", data, "--model", str(base), "--data-dir", str(root / "data"), "--out", str(out),
            "--prompts", "2,1,1", "--negatives", "1,1,1", "--batch", "6", "--lr", "3e-3", "--log-every", "1", *extra]


def losses(out):
    return [float(line.split(" loss ")[1].split()[0]) for line in (out / "log.txt").read_text().splitlines()
            if line.startswith("epoch ")]


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_training_lowers_loss_and_leaves_bert_untouched(setup, tmp_path, capsys, dtype):
    model = train.main(train.parse_args(args(setup, tmp_path, "--epochs", "6", "--dtype", dtype)))
    first, last = losses(tmp_path)[0], losses(tmp_path)[-1]
    assert last < first - 0.05, (first, last)
    fresh = load_bert(setup[1]).model.state_dict()
    for name, t in model.bert.state_dict().items():  # bf16: the frozen linears are held in bf16 (the next test)
        assert torch.equal(t, fresh[name].to(t.dtype)), name  # bit-identical: frozen means frozen
    ckpt = load_file(tmp_path / "ckpt.safetensors")
    assert set(ckpt) == {checkpoints.stored_name(n) for n, p in model.named_parameters() if p.requires_grad}
    assert not any(n.startswith("bert.") for n in ckpt)
    assert "dev after epoch 6: mrr" in capsys.readouterr().out
    assert f"{dtype} eta" in (tmp_path / "log.txt").read_text()


def test_patience_ends_the_run_once_dev_has_not_risen_for_that_many_dev_points(setup, tmp_path, monkeypatch):
    """--patience 3 on a scripted dev curve .5 .6 .55 .6 .58 (a tie is no rise): the run ends after epoch 5 of 8, its
    best.safetensors from epoch 2, and the log says why; resumed, it trains nothing more."""
    curve = iter([0.5, 0.6, 0.55, 0.6, 0.58, 0.9, 0.9, 0.9])
    real = train.dev_metric

    def scripted(*a, **k):
        figure, _ = real(*a, **k)
        value = next(curve)
        return figure | {"value": value}, f"scripted {value}"
    monkeypatch.setattr(train, "dev_metric", scripted)
    out = tmp_path / "run"
    train.main(train.parse_args(args(setup, out, "--epochs", "8", "--patience", "3", "--dtype", "fp32")))
    log = (out / "log.txt").read_text()
    assert [line.split(": ")[1] for line in log.splitlines() if line.startswith("dev after")] == [
        "scripted 0.5 (best so far)", "scripted 0.6 (best so far)", "scripted 0.55", "scripted 0.6", "scripted 0.58"]
    said = "dev has not risen for 3 dev points in a row: the run ends after epoch 5 (--patience 3)"
    assert said in log and "epoch 6/8" not in log
    history = checkpoints.read_checkpoint(out / "best.safetensors")[1]
    assert history["best_epoch"] == 2 and history["epoch"] == 2
    train.main(train.parse_args(args(setup, out, "--epochs", "8", "--patience", "3", "--dtype", "fp32", "--resume")))
    again = (out / "log.txt").read_text()[len(log):]
    assert again.count(said) == 1 and "epoch 6/8" not in again and "dev after" not in again


def test_bf16_holds_the_frozen_linears_in_bf16_and_takes_bit_identical_steps(setup, tmp_path):
    """autocast recasts a frozen weight at every call; train.build casts the frozen linear layers once instead."""
    run, cpu = train.parse_args(args(setup, tmp_path)), torch.device("cpu")
    cast, plain = (train.build(run, dtype, cpu) for dtype in ("bf16", "fp32"))  # fp32: the weights as loaded
    for (model, *_), dtype in ((cast, torch.bfloat16), (plain, torch.float32)):
        assert {p.dtype for n, p in model.named_parameters() if ".layers." in n and "ln" not in n} == {dtype}
        assert {p.dtype for p in model.parameters() if p.requires_grad} == {torch.float32}  # what trains stays fp32
    kg, enc = plain[1], plain[2]
    batch = data.build_batch(enc, kg.train[:12], run.prompts, run.max_seq_length)  # 6 positives, 6 "negatives"
    losses = []
    for model, _, _, _, params, opt in (cast, plain):
        model.train()
        for step in range(3):
            torch.manual_seed(step)  # the same dropout masks
            losses.append(train.train_step(model, opt, params, batch, 6, 1e-3, 1.0, "bf16", cpu).item())
    assert losses[:3] == losses[3:] and len(set(losses)) > 1, losses  # the same steps, and they train
    for name, p in cast[4].items():
        assert torch.equal(p, plain[4][name]), name


def test_finetune_trains_every_parameter_and_tc_reports_dev_accuracy(setup, tmp_path, capsys):
    fresh = load_bert(setup[1]).model.state_dict()
    a = args(setup, tmp_path, "--epochs", "1", "--finetune", data="wn11")
    a[a.index("--prompts") + 1] = "0,0,0"  # as good as leaving it out: the recipe's prompts are switched off
    model = train.main(train.parse_args(a))
    changed = {n for n, t in model.bert.state_dict().items() if not torch.equal(t, fresh[n])}
    assert changed == set(fresh)  # every tensor of the LM moved (KG-BERT style)
    assert model.P is None and model.W_p is None and model.calib_layers == ()
    assert "dev after epoch 1: accuracy" in capsys.readouterr().out


@pytest.mark.parametrize("part", [["--prompts", "2,1,1"], ["--calib", "1"], ["--prompt-mlp"]])
def test_finetune_beside_a_palt_part_is_one_argparse_error(setup, tmp_path, capsys, part):
    argv = ["--data", "wn11", "--data-dir", str(setup[0] / "data"), "--finetune", *part]
    with pytest.raises(SystemExit) as e:
        train.parse_args(argv)
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(f"--finetune trains the whole LM and none of PALT's "
                                                             f"parts: drop {part[0]}")


def test_a_headless_checkpoint_trains_its_heads_to_train(setup, tmp_path):
    root, _, headless = setup
    a = args(setup, tmp_path, "--epochs", "1")
    a[a.index("--model") + 1] = str(headless)
    model = train.main(train.parse_args(a))
    assert {"bert.pooler.weight", "bert.nsp.weight"} <= set(load_file(tmp_path / "ckpt.safetensors"))
    assert model.bert.nsp.weight.requires_grad and not model.bert.layers[0].q.weight.requires_grad


def test_head_lr_scales_the_heads_to_train_only_and_weight_decay_skips_biases(setup, tmp_path):
    root, _, headless = setup
    for extra, head_scale in (([], 1.0), (["--head-lr", "3e-2"], 10.0)):
        a = args(setup, tmp_path, "--recipe", "paper", *extra)  # a recipe without a head lr of its own
        a[a.index("--model") + 1] = str(headless)
        model, _, _, _, params, opt = train.build(train.parse_args(a), "fp32", torch.device("cpu"))
        group = {id(p): g for g in opt.param_groups for p in g["params"]}
        assert sum(len(g["params"]) for g in opt.param_groups) == len(params)
        for n, p in params.items():
            assert group[id(p)]["lr_scale"] == pytest.approx(head_scale if n.startswith(("bert.pooler.", "bert.nsp.")) else 1.0), n
            assert group[id(p)]["weight_decay"] == (0.01 if p.ndim >= 2 else 0.0), n


def test_dev_every_adds_a_curve_and_changes_no_weight(setup, tmp_path, capsys):
    plain = train.main(train.parse_args(args(setup, tmp_path / "plain", "--epochs", "2", "--dtype", "fp32", data="wn11")))
    curve = train.main(train.parse_args(args(setup, tmp_path / "curve", "--epochs", "2", "--dtype", "fp32",
                                             "--dev-every", "2", data="wn11")))
    for (n, a), b in zip(plain.state_dict().items(), curve.state_dict().values()):
        assert torch.equal(a, b), n  # evaluating in the middle of an epoch leaves training untouched
    meta = checkpoints.read_checkpoint(tmp_path / "curve" / "ckpt.safetensors", tensors=False)[1]
    steps = [d["step"] for d in meta["dev"]]
    per_epoch = steps[-1] // 2
    assert steps == sorted(set(range(2, 2 * per_epoch, 2)) | {per_epoch, 2 * per_epoch})  # never twice at an epoch's end
    assert [d["epoch"] for d in meta["dev"] if d["step"] % per_epoch == 0] == [1, 2] and meta["best_epoch"] in (1, 2)
    assert "dev at step 2 (epoch " in capsys.readouterr().out
    if importlib.util.find_spec("matplotlib"):  # the curve drawn beside the log, at each dev point
        assert (tmp_path / "curve" / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    records, dev, starts = runlog.read_metrics(tmp_path / "curve")  # metrics.jsonl: a line per log step, dev point
    assert starts == [0] and [r["step"] for r in records] == list(range(1, steps[-1] + 1))
    assert [(r["step"], r["epoch"], r["value"]) for r in dev] == [(d["step"], d["epoch"], d["value"]) for d in meta["dev"]]
    c = plot.read_curve(tmp_path / "curve")  # plot.py curve RUN_FOLDER reads it back
    assert c.name == "curve" and len(c.loss) == steps[-1] and [d["step"] for d in c.dev] == steps


def test_tensorboard_without_its_package_is_one_line_before_the_model_loads(setup, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # `import torch.utils.tensorboard`: ImportError
    monkeypatch.setattr(train.signal, "signal", lambda *a: None)  # pytest keeps its own Ctrl-C
    monkeypatch.setattr(train, "build", lambda *a: pytest.fail("the model loaded"))
    with pytest.raises(SystemExit, match="^error: --tensorboard needs the tensorboard package: pip install tensorboard$"):
        train.command_line(args(setup, tmp_path, "--tensorboard"))


def test_a_sampled_dev_ranking_is_labelled_in_the_log_and_the_checkpoint(setup, tmp_path, capsys):
    train.main(train.parse_args(args(setup, tmp_path, "--epochs", "1", "--dev-sample", "2", "--dev-limit", "3")))
    dev = checkpoints.read_checkpoint(tmp_path / "ckpt.safetensors", tensors=False)[1]["dev"][-1]
    everyone = len(graphs.load_kg("umls", setup[0] / "data").split_entities)
    assert dev["sampled"] and dev["triples"] == 3 and 2 <= dev["candidates"] < everyone  # 2 + the answers
    assert f"on 3 dev triples against {dev['candidates']} sampled candidates" in capsys.readouterr().out


def test_a_recipe_fills_only_what_the_command_line_leaves_open():
    cpu = train.parse_args(["--data", "wn18rr", "--recipe", "cpu", "--lr", "5e-4"])
    assert (cpu.negatives, cpu.dev_sample, cpu.dev_every, cpu.lr, cpu.epochs) == ((1, 0, 1), 100, 500, 5e-4, 1)
    gpu = train.parse_args(["--data", "umls", "--recipe", "gpu"])
    cpu_umls = train.PRESETS["cpu"]["umls"]
    assert (gpu.batch, gpu.lr, gpu.compile) == (cpu_umls["batch"], cpu_umls["lr"], True)  # the cpu recipe, compiled
    assert train.parse_args(["--data", "umls", "--recipe", "gpu", "--no-compile"]).compile is False
    gpu = train.parse_args(["--data", "wn18rr", "--recipe", "gpu"])
    assert (gpu.epochs, gpu.hard_negatives) == (10, 0.5)  # a GPU trains the paper's epochs, the sweep's choice
    assert gpu.dev_every == 2500 and "dev_every" in checkpoints.RESUME_MAY_CHANGE  # the committed runs resume with it
    assert train.parse_args(["--data", "wn18rr", "--recipe", "gpu", "--hard-negatives", "0"]).hard_negatives == 0
    assert cpu.hard_negatives == 0.0  # a recipe without them: none
    paper = train.parse_args(["--data", "wn18rr", "--recipe", "paper"])
    # the paper's big graphs pick their best by the stratified dev estimate (7e7a52a): 100 draws
    assert (paper.negatives, paper.dev_sample, paper.prompts, paper.lr) == ((5, 5, 5), 100, (10, 10, 10), 1e-5)


def run(cmd, **env):
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=os.environ | env, timeout=300)
    return r


@pytest.mark.slow  # two processes under torchrun, and a run of one
def test_two_process_ddp_equals_one_process(setup, tmp_path):
    # fp32: bf16 results depend on the batch shapes, and the ranks' batches differ from one process's batch
    one = run([sys.executable, "train.py", *args(setup, tmp_path / "one", "--epochs", "2", "--dtype", "fp32")])
    assert one.returncode == 0, one.stderr
    two = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "train.py", *args(setup, tmp_path / "two", "--epochs", "2", "--dtype", "fp32")], OMP_NUM_THREADS="1")
    assert two.returncode == 0, two.stderr
    a, b = load_file(tmp_path / "one" / "ckpt.safetensors"), load_file(tmp_path / "two" / "ckpt.safetensors")
    assert set(a) == set(b)
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-5, rtol=1e-4)


@pytest.mark.slow  # two processes under torchrun
def test_under_ddp_every_process_ends_with_process_0s_patience_verdict(setup, tmp_path):
    """Only process 0 holds the dev curve: the others take its --patience verdict, so that all end after epoch 2 of
    4 (a process that trained on would wait for the others for ever)."""
    out = tmp_path / "two"
    two = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "tests/scripted_dev.py", "0.5,0.4,0.9,0.9", *args(setup, out, "--epochs", "4", "--patience", "1",
                                                              "--dtype", "fp32")], OMP_NUM_THREADS="1")
    assert two.returncode == 0, two.stderr
    log = (out / "log.txt").read_text()
    assert "dev has not risen for 1 dev point in a row: the run ends after epoch 2 (--patience 1)" in log
    assert "epoch 3/4" not in log


def one_rank_group(monkeypatch):
    """torchrun's environment for one rank of a gloo group in this process, on a free port."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for k, v in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)).items():
        monkeypatch.setenv(k, v)


def test_ddp_is_freed_before_its_process_group_is_destroyed(setup, tmp_path, monkeypatch):
    """DDP's reducer holds the group's gloo work: alive at destroy_process_group, it can abort the process at exit
    (SIGABRT, "terminate called without an active exception": a CI run of the two-process test above)."""
    import gc
    one_rank_group(monkeypatch)
    alive, destroy = [], train.dist.destroy_process_group
    ddp_type = torch.nn.parallel.DistributedDataParallel
    monkeypatch.setattr(train.dist, "destroy_process_group",
                        lambda: alive.append(sum(type(o) is ddp_type for o in gc.get_objects())) or destroy())
    train.main(train.parse_args(args(setup, tmp_path, "--epochs", "1", "--dtype", "fp32")))
    assert alive == [0] and not train.dist.is_initialized()


def test_cudagraphs_are_refused_under_torchrun_before_the_model_loads(setup, tmp_path, monkeypatch):
    """DDP's gradient all-reduce runs inside the backward a CUDA graph would capture: one GPU only."""
    one_rank_group(monkeypatch)
    monkeypatch.setattr(train, "build", lambda *a: pytest.fail("the model loaded"))
    with pytest.raises(FlagError, match="^--cudagraphs trains on one GPU without DDP: leave it out under torchrun$"):
        train.main(train.parse_args(args(setup, tmp_path, "--compile", "--cudagraphs")))
    train.dist.destroy_process_group()
    assert not (tmp_path / "state.safetensors").exists()


@pytest.mark.slow  # compiles the step twice on CPU; also run by --device cuda
@pytest.mark.skipif(not torch.cuda.is_available() and shutil.which(os.environ.get("CXX", "g++")) is None,
                    reason="torch.compile on CPU needs g++")
def test_the_compiled_step_with_cudagraphs_trains_as_the_eager_step(setup, tmp_path, device):
    """--compile --cudagraphs takes the eager steps: the same losses and weights over batches of two shapes,
    each three times (on a GPU: the shape's warm-up, its graph's capture, a replay; on a CPU compiled alone)."""
    run = train.parse_args(args(setup, tmp_path, "--compile", "--cudagraphs", "--dtype", "fp32"))
    (eager, kg, enc, _, eager_params, eager_opt), (model, _, _, _, params, opt) = (
        train.build(run, "fp32", device) for _ in range(2))
    # 6 positives + 6 "negatives", then 4 + 4: two shapes (the tiny graph's texts are all alike long)
    batches = [(data.build_batch(enc, kg.train[i:i + 2 * n], run.prompts, run.max_seq_length), n) for i, n in
               ((0, 6), (12, 4))]
    forward = devices.compiled(model, run)
    assert forward is not model
    losses = []
    for m, f, p, o in ((eager, eager, eager_params, eager_opt), (model, forward, params, opt)):
        m.train()
        losses.append([train.train_step(f, o, p, b, n, 3e-3, 1.0, "fp32", device).item() for b, n in batches * 3])
    torch.testing.assert_close(losses[1], losses[0], atol=1e-4, rtol=0)  # fused kernels round differently (TF32 too)
    assert len(set(losses[0])) == 6  # it trains: no step repeats a loss
    for name, p in params.items():
        torch.testing.assert_close(p, eager_params[name], atol=1e-4, rtol=1e-4, msg=name)


@pytest.mark.slow  # compiles the step on CPU
def test_dropout_in_the_compiled_step_draws_its_masks_from_each_steps_seed(setup, tmp_path, device):
    """Under --compile --cudagraphs a replayed step draws fresh dropout masks from the seed train.py sets before it
    (a graph that replayed its capture's masks would train the whole run on one mask), and a seed seen before gives
    its masks again (--resume replays a step exactly). On a GPU calls 1-2 warm up and capture, 3-6 replay."""
    model_dir = shutil.copytree(setup[1], tmp_path / "bert-dropout")
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps(config | dict(hidden_dropout_prob=0.1,
                                                                    attention_probs_dropout_prob=0.1)))
    run = train.parse_args(args(setup, tmp_path / "out", "--compile", "--cudagraphs", "--dtype", "fp32", "--model",
                                str(model_dir)))
    model, kg, enc, _, params, opt = train.build(run, "fp32", device)
    model.train()
    forward, batch = devices.compiled(model, run), data.build_batch(enc, kg.train[:12], run.prompts, run.max_seq_length)

    def loss(seed):  # lr 0: the weights stay as they are, only the masks can move the loss
        torch.manual_seed(seed)
        return train.train_step(forward, opt, params, batch, 6, 0.0, 1.0, "fp32", device).item()

    seen = [loss(seed) for seed in (1, 1, 2, 1, 2, 1)]
    assert seen[2] != seen[3], seen  # another seed, other masks: dropout is on and follows the seed
    assert seen[3] == seen[5] and seen[2] == seen[4], seen  # replays of one seed: the same masks


@pytest.mark.slow  # three train.py runs; the default suite resumes a kill at an epoch's end
def test_killed_run_resumes_to_the_same_end(setup, tmp_path):
    # Bit for bit (torch.equal) holds only where the arithmetic is deterministic: fp32 (--dtype auto may pick bf16
    # autocast) and one thread for every run (OMP_NUM_THREADS=1: with 2 threads two uninterrupted MiniLM CPU runs
    # already differ by ~4e-8). Both conditions are pinned here; the resume logic itself adds no difference.
    pinned = ("--epochs", "3", "--dtype", "fp32")
    straight = run([sys.executable, "train.py", *args(setup, tmp_path / "straight", *pinned)], OMP_NUM_THREADS="1")
    assert straight.returncode == 0, straight.stderr
    steps_per_epoch = len(list((setup[0] / "data" / "umls" / "train.tsv").read_text().splitlines())) // 6
    # killed in the middle of epoch 2, after a dev point (--dev-every 2) saved the resume state at its step
    crash = run([sys.executable, "tests/crash_at_step.py", str(steps_per_epoch + 3),
                 *args(setup, tmp_path / "crash", *pinned, "--dev-every", "2")], OMP_NUM_THREADS="1")
    assert crash.returncode == 3
    resumed = run([sys.executable, "train.py", *args(setup, tmp_path / "crash", *pinned, "--resume")],
                  OMP_NUM_THREADS="1")
    assert resumed.returncode == 0, resumed.stderr
    last_dev_point = (steps_per_epoch + 3) // 2 * 2
    line = f"resumed from {tmp_path / 'crash'}/state.safetensors: epoch 1, step {last_dev_point}"
    assert line in resumed.stdout and line in (tmp_path / "crash" / "log.txt").read_text()  # the log shows the seam
    a, b = load_file(tmp_path / "straight" / "ckpt.safetensors"), load_file(tmp_path / "crash" / "ckpt.safetensors")
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_a_signal_ends_the_run_after_the_step_under_way_and_resume_reaches_the_same_end(setup, tmp_path, monkeypatch):
    """Ctrl-C or a kill (SIGINT, SIGTERM; a GPU call's time running out): the step finishes, its weights and resume
    state are saved, the run ends; --resume then trains to what an uninterrupted run gives."""
    pinned = ("--epochs", "3", "--dtype", "fp32")
    straight = train.main(train.parse_args(args(setup, tmp_path / "straight", *pinned)))
    calls = signal_at_step(monkeypatch, 13)  # as if SIGTERM arrived while step 13 (in epoch 2) ran
    train.main(train.parse_args(args(setup, tmp_path / "stopped", *pinned)))
    log = (tmp_path / "stopped" / "log.txt").read_text()
    assert re.search(rf"stopped at step 13 \(SIGTERM; \d+\.\d min of steps\): {re.escape(str(tmp_path / 'stopped'))}/ckpt", log) and len(calls) == 13
    assert "epoch 3/3" not in log
    monkeypatch.setattr(runlog, "STOP", [])
    resumed = train.main(train.parse_args(args(setup, tmp_path / "stopped", *pinned, "--resume")))
    assert "resumed from" in (tmp_path / "stopped" / "log.txt").read_text().split("stopped at step 13")[1]
    for (name, a), b in zip(straight.named_parameters(), resumed.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0, msg=name)


def test_ctrl_c_saves_and_ends_the_command_line_run(setup, tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "train.py", *args(setup, out, "--epochs", "2000", "--dtype", "fp32")],
                            cwd=ROOT, env=os.environ | {"OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:  # once a step has been logged, Ctrl-C
            if line.startswith("epoch 1/2000 step 3/"):
                proc.send_signal(signal.SIGINT)
                break
        rest = proc.communicate(timeout=120)[0]
    finally:
        proc.kill()
    assert proc.returncode == 0 and re.search(r"stopped at step \d+ \(SIGINT; ", rest), rest[-1000:]
    step = int(re.search(r"stopped at step (\d+)", rest).group(1))
    saved = checkpoints.read_checkpoint(out / "state.safetensors", kind="train-state", tensors=False)[1]
    assert int(saved["step"]) == step and (out / "ckpt.safetensors").is_file()


def test_a_failed_save_keeps_the_last_epoch_and_says_how_to_resume(setup, tmp_path, monkeypatch):
    import errno
    real, calls = checkpoints.save_atomic, []

    def disk_full_in_epoch_2(path, tensors, meta):
        calls.append(path.name)
        if meta["epoch"] == 2 and path.name == "ckpt.safetensors":
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, tensors, meta)

    monkeypatch.setattr(checkpoints, "save_atomic", disk_full_in_epoch_2)  # checkpoints and the resume state
    with pytest.raises(OutputError, match=r"cannot write .*ckpt.safetensors \(No space left on device\); the previous "
                                          r"file is kept: fix that and run again with --resume to continue from the last saved state"):
        train.main(train.parse_args(args(setup, tmp_path, "--epochs", "2", "--dtype", "fp32")))
    state = load_file(tmp_path / "state.safetensors")  # the resume unit still says epoch 1, and --resume finishes
    monkeypatch.setattr(checkpoints, "save_atomic", real)
    model = train.main(train.parse_args(args(setup, tmp_path, "--epochs", "2", "--dtype", "fp32", "--resume")))
    assert "model.prompts" in state and calls.count("state.safetensors") == 1
    assert not torch.equal(state["model.prompts"], model.P.detach())  # epoch 2 trained after the resume


def test_hard_negatives_and_a_stratified_dev_estimate(setup, tmp_path, capsys, monkeypatch):
    """--hard-negatives draws corruptions from the frozen encoder's nearest entities; --dev-near N makes the dev MRR a
    stratified estimate of the exact one: each query's N nearest (and its entity's) scored, --dev-sample draws."""
    import evaluate
    got = {}
    real = evaluate.rank_split
    monkeypatch.setattr(evaluate, "rank_split", lambda *a, **k: got.setdefault("near", k["near"]) is not None and real(*a, **k))
    train.main(train.parse_args(args(setup, tmp_path, "--epochs", "1", "--hard-negatives", "0.5", "--dev-near", "3",
                                     "--dev-sample", "2", "--dtype", "fp32")))
    out = capsys.readouterr().out
    assert "nearest 32 entities of each entity by the frozen encoder" in out and "dev after epoch 1: inverse rank" in out
    dev = [line for line in out.splitlines() if line.startswith("dev after epoch 1")][0]
    assert " MR " in dev and "mrr" not in dev and dev.endswith("runs ~2x it: not an MRR) (best so far)")  # no MRR
    assert got["near"].shape[1] == 3
    dev = [line for line in out.splitlines() if line.startswith("dev after epoch 1")][0]
    scored = int(dev.split("(stratified estimate, ")[1].split()[0])  # the answer, <= 1 + 2 x 3 hard ones, 2 draws
    assert 3 <= scored <= 1 + 7 + 2
    with pytest.raises(SystemExit):
        train.parse_args(args(setup, tmp_path / "x", "--hard-negatives", "1.5"))


def test_a_checkpoint_records_paths_inside_the_project_relative_and_others_absolute(tmp_path, monkeypatch):
    """Run from a folder outside the project with --out runs/probe and --data mykg: the record must not say
    runs/probe, which reads as the project's own runs/ (and evaluate.py, run from elsewhere, must find the graph)."""
    shutil.copytree(ROOT / "tests" / "example_kg", tmp_path / "mykg")
    monkeypatch.chdir(tmp_path)
    outside = flags.recorded(train.parse_args(["--data", "mykg", "--out", "runs/probe"]))
    assert outside["out"] == str(tmp_path.resolve() / "runs" / "probe")
    assert outside["data"] == str(tmp_path.resolve() / "mykg")
    monkeypatch.chdir(ROOT / "tests")
    inside = flags.recorded(train.parse_args(["--data", "example_kg", "--out", "../runs/x", "--data-dir", "."]))
    assert (inside["out"], inside["data"], inside["data_dir"]) == ("runs/x", "tests/example_kg", "tests")
    benchmark = flags.recorded(train.parse_args(["--data", "UMLS"]))
    assert (benchmark["data"], benchmark["model"]) == ("umls", "minilm")  # names stay names


def test_a_dev_point_within_noise_of_a_random_scorer_says_so(setup, tmp_path):
    """Scores that carry nothing (every triple the same score: each answer ties with every candidate) put the dev MRR
    under a random scorer's; the dev line says so and gives the random scorer's MRR beside it."""
    run, cpu = train.parse_args(args(setup, tmp_path)), torch.device("cpu")
    model, kg, enc, *_ = train.build(run, "fp32", cpu)
    with torch.no_grad():
        model.bert.nsp.weight.zero_()  # the same logits for every input
    dev, line = evaluate.dev_metric(model.eval(), kg, enc, run, cpu, "fp32")
    lpq = evaluate.lp_queries(kg, "dev")
    mean, sd = evaluate.random_mrr(lpq, np.arange(len(kg.dev)))
    assert dev["value"] < mean and dev["random"] == pytest.approx(mean)
    assert line.endswith(f"; within noise of a random scorer (MRR {mean:.4f} +- {2 * sd:.4f} on these triples): "
                         "nothing learned yet, or text that carries nothing (README, Your own graph)")
    assert evalcli.chance_note(mean + 2.5 * sd, mean, sd, "MRR") == ""  # beyond 2 sd: no note
    assert evalcli.chance_note(mean + 1.5 * sd, mean, sd, "MRR").startswith("; within noise")


# ----------------------------------------------------------------------------- one run a folder
def popen_train(setup, out, *extra):
    """train.py as a user starts it, in the background, its output read line by line."""
    return subprocess.Popen([sys.executable, "train.py", *args(setup, out, "--epochs", "2000", "--dtype", "fp32", *extra)],
                            cwd=ROOT, env=os.environ | {"OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def wait_for(proc, *prefixes):
    """Read proc's output until a line starting with one of the prefixes (returned)."""
    for line in proc.stdout:
        if line.startswith(prefixes):
            return line
    raise AssertionError(f"no line {prefixes!r}: {proc.stderr.read()[-2000:]}")


def test_a_second_run_into_a_folder_in_use_is_refused_and_the_first_runs_on(setup, tmp_path):
    """Two runs typed into one --out (another terminal, a scheduler's retry): the second is refused in one line naming
    the folder and the process holding it, with or without --resume, and writes nothing there; the first trains on,
    stops on Ctrl-C with its own files whole."""
    out = tmp_path / "run"
    first = popen_train(setup, out)
    try:
        wait_for(first, "epoch 1/2000 step 3/")
        for extra in ((), ("--resume",)):
            second = run([sys.executable, "train.py", *args(setup, out, "--epochs", "2000", "--dtype", "fp32", *extra)],
                         OMP_NUM_THREADS="1")
            assert second.returncode == 1 and "Traceback" not in second.stderr, second.stderr[-2000:]
            assert re.fullmatch(rf"error: {re.escape(str(out))} \(--out\) is in use by process {first.pid} on \S+ "
                                r"\(since [\d-]+ [\d:]+\): wait for it to end, or choose another --out\n", second.stderr)
        first.send_signal(signal.SIGINT)
        rest = first.communicate(timeout=120)[0]
    finally:
        first.kill()
    assert first.returncode == 0 and "stopped at step" in rest, rest[-1000:]
    step = int(re.search(r"stopped at step (\d+)", rest).group(1))
    log = (out / "log.txt").read_text()
    assert log.count("epoch 1/2000 step 1/") == 1 and "resumed" not in log  # the second wrote no line
    saved = checkpoints.read_checkpoint(out / "state.safetensors", kind="train-state", tensors=False)[1]
    assert int(saved["step"]) == step and len(load_file(out / "ckpt.safetensors"))


def test_a_lock_left_by_a_killed_run_does_not_block_its_resume(setup, tmp_path):
    """kill -9 (or a power cut) leaves out/.lock naming a process that is gone: the kernel dropped its lock, so
    --resume continues the run."""
    out = tmp_path / "run"
    killed = popen_train(setup, out, "--dev-every", "2")
    try:
        wait_for(killed, "epoch 1/2000 step 3/")  # after the dev point at step 2 saved the resume state
        killed.kill()  # SIGKILL: no handler runs
        killed.wait(timeout=60)
    finally:
        killed.kill()
    assert f"process {killed.pid} " in (out / ".lock").read_text()
    resumed = popen_train(setup, out, "--dev-every", "2", "--resume")
    try:
        line = wait_for(resumed, "resumed from", "--resume:")
        assert line.startswith(f"resumed from {out}/state.safetensors: epoch 0, step "), line
        resumed.send_signal(signal.SIGINT)
        rest = resumed.communicate(timeout=120)[0]
    finally:
        resumed.kill()
    assert resumed.returncode == 0 and "stopped at step" in rest, rest[-1000:]
    assert f"process {resumed.pid} " in (out / ".lock").read_text()


def test_adamw_takes_the_authors_betas_and_eps_and_an_older_state_resumes_under_the_defaults(setup, tmp_path):
    """--adam-beta2 and --adam-eps reach the optimizer; a resume state saved before a setting existed held its default,
    so it resumes; a changed setting is refused."""
    run = train.parse_args(args(setup, tmp_path, "--adam-beta2", "0.98", "--adam-eps", "1e-6", "--max-steps", "1",
                                "--recipe", "cpu"))
    model, kg, enc, meta, params, opt = train.build(run, "fp32", torch.device("cpu"))
    assert opt.param_groups[0]["betas"] == (0.9, 0.98) and opt.param_groups[0]["eps"] == 1e-6
    now = train.parse_args(args(setup, tmp_path, "--max-steps", "1", "--recipe", "cpu"))  # no recipe sets AdamW's
    record = flags.recorded(now)
    old = {k: v for k, v in record.items() if k not in ("adam_beta2", "adam_eps", "either_side")}
    checkpoints.check_resumable({"run": json.dumps(old)}, {"run": json.dumps(record)}, tmp_path / "state.safetensors")
    assert train.parse_args(args(setup, tmp_path)).adam_beta2 == 0.98  # --recipe paper: the authors' scripts'
    with pytest.raises(FlagError, match="was trained with adam_beta2 0.999, not 0.98"):
        checkpoints.check_resumable({"run": json.dumps(old)}, {"run": json.dumps(flags.recorded(run))}, tmp_path / "s")
    with pytest.raises(SystemExit):
        train.parse_args(args(setup, tmp_path, "--either-side"))  # with --negatives 1,1,1: refused
    assert train.parse_args(args(setup, tmp_path, "--either-side", "--negatives", "1,0,1")).either_side


def test_a_loss_at_the_priors_entropy_all_epoch_is_named_with_what_to_try():
    """1 true triple in 16 (negatives 5,5,5): predicting the prior alone loses 0.2338 a sequence. An epoch whose every
    log line sits there says so; one that falls below it, or starts above it, does not."""
    batch = {"attention_mask": torch.ones(2, 3), "input_ids": torch.ones(2, 3)}

    def epoch(losses, negatives=15):
        meter = runlog.Meter(0.0, torch.device("cpu"))
        for i, loss in enumerate(losses):
            meter.add(torch.tensor(loss), batch)
            if i % 2 == 1:  # a log line every 2 steps
                meter.figures(0, i + 1, len(losses), 1e-3, 8, 1)
        return meter.at_prior(negatives_a_positive=negatives)

    said = epoch([0.2341, 0.2335] * 4)
    assert said.startswith("the loss sat at 0.2338 all epoch, the entropy of the prior (1 true triple in 16)")
    assert "--recipe tuned or cpu" in said and "\n" not in said
    assert epoch([0.2341, 0.2335] * 3 + [0.15, 0.14]) is None  # it learned at the end
    assert epoch([0.69, 0.40] + [0.2338] * 6) is None  # it began above the prior
    assert epoch([0.5623] * 4) is None  # 1 in 16 expects less
    assert "at 0.5623 all epoch" in epoch([0.5623] * 4, negatives=3)  # 1,1,1: 1 true triple in 4
