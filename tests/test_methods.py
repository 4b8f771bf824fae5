"""The methods PALT is compared with (palt.py, train.py --method): an untrained update is the base model, each method
trains exactly what it names, each trains, resumes and loads back, and a method beside another's flags is refused."""
import json

import pytest
import torch
from safetensors.torch import load_file

import train
from conftest import make_bert_dir, signal_at_step, write_tiny_kg
from palt import METHODS, PALT, PaltConfig, param_report, score
from support.errors import ConfigError
from support import checkpoints, evalcli, runlog
from support.hub import load_bert
from test_palt import batch

H, LAYERS = 32, 2  # make_bert_dir's hidden size; the layers of the models here


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("methods")
    words = write_tiny_kg(root / "data", "umls") + [f"w{i}" for i in range(40)]  # ids up to 45: test_palt.batch
    return root, make_bert_dir(root / "bert", words, layers=LAYERS), make_bert_dir(root / "headless", words, nsp=False)


def base_logits(path, b):
    bert = load_bert(path).model.eval()
    with torch.no_grad():
        return bert(b["input_ids"], b["token_type_ids"], b["attention_mask"]).nsp_logits


@pytest.mark.parametrize("method", ["palt", "finetune", "lora", "bitfit", "probe"])
def test_an_untrained_method_without_prompts_scores_exactly_as_the_base_model(setup, method):
    _, base, _ = setup
    cfg = PaltConfig(method=method, prompts=(0, 0, 0))
    model = PALT(load_bert(base).model, cfg).eval()
    b = batch()
    with torch.no_grad():
        assert torch.equal(model(**b), base_logits(base, b))


def test_prompt_tuning_adds_prompt_tokens_so_it_is_not_the_base_model(setup):
    _, base, _ = setup
    b = batch(prompts=(1, 1, 0))
    model = PALT(load_bert(base).model, PaltConfig(method="prompt", prompts=(1, 1, 0))).eval()
    assert model.W_p is None and model.calib_layers == () and model.P.shape == (2, H)
    with torch.no_grad():
        assert not torch.equal(model(**b), base_logits(base, {**b, "prompt_index": None}))


HEADS = {"bert.pooler.weight", "bert.pooler.bias", "bert.nsp.weight", "bert.nsp.bias"}
LORA = {f"bert.layers.{i}.{m}.{ab}" for i in range(LAYERS) for m in ("q", "v") for ab in ("A", "B")}


def bias_names(model):
    return {n for n, _ in model.bert.named_parameters() if n.endswith("bias")}


@pytest.mark.parametrize("headless", [False, True])
def test_each_method_trains_exactly_the_parameters_it_names(setup, headless):
    """With an NSP head (BERT) a method trains its own part, a probe the pretrained head; without one (MiniLM)
    every method also trains the pooler and the new NSP head."""
    _, base, no_head = setup
    path = no_head if headless else base
    heads = HEADS if headless else set()
    expected = {
        "palt": {"W_p.weight", "W_p.bias", "P", "W_c.1.weight", "W_c.1.bias"} | heads,
        "lora": LORA | heads,
        "prompt": {"P"} | heads,
        "probe": HEADS,
    }
    for method in METHODS:
        loaded = load_bert(path)
        prompts = (2, 0, 0) if method in ("palt", "prompt") else (0, 0, 0)
        model = PALT(loaded.model, PaltConfig(method=method, prompts=prompts, calib_layers=(1,) if method == "palt"
                                              else None), loaded.heads_to_train)
        trainable = {n for n, p in model.named_parameters() if p.requires_grad}
        if method == "finetune":
            assert trainable == {n for n, _ in model.named_parameters()} and param_report(model)["percent"] == 100
        elif method == "bitfit":
            assert trainable == {"bert." + n for n in bias_names(model)} | heads
            assert {"bert.layers.0.q.bias", "bert.layers.1.ln2.bias", "bert.embeddings.ln.bias"} <= trainable
        else:
            assert trainable == expected[method], method
        report = param_report(model)
        assert report["tunable"] == sum(p.numel() for p in model.parameters() if p.requires_grad)
        assert sum(report["parts"].values()) == report["tunable"]


def test_lora_counts_rank_times_both_sides_of_q_and_v_and_scales_by_alpha_over_rank(setup):
    _, base, _ = setup
    model = PALT(load_bert(base).model, PaltConfig(method="lora", lora_rank=4, lora_alpha=2.0))
    assert param_report(model)["parts"] == {"lora": LAYERS * 2 * 4 * (H + H)}
    q = model.bert.layers[0].q
    with torch.no_grad():
        q.B.fill_(1.0)
    x = torch.randn(3, H)
    assert torch.allclose(q(x), q.base(x) + (x @ q.A.T).sum(-1, keepdim=True) * 0.5, atol=1e-5)


@pytest.mark.parametrize("cfg, message", [
    (dict(method="lora", prompts=(2, 0, 0)), "has no prompt tokens"),
    (dict(method="bitfit", calib_layers=(1,)), "has no calibration or W_p"),
    (dict(method="probe", prompt_encoder=True), "has no calibration or W_p"),
    (dict(method="prompt", prompts=(0, 0, 0)), "trains prompt tokens"),
    (dict(method="lora", lora_rank=0), "rank of at least 1"),
    (dict(method="adapters"), "method must be one of"),
])
def test_a_configuration_against_its_method_is_refused_in_one_line(setup, cfg, message):
    with pytest.raises(ConfigError, match=message) as e:
        PALT(load_bert(setup[1]).model, PaltConfig(**cfg))
    assert "\n" not in str(e.value)


def cli(setup, out, *extra):
    root, _, headless = setup
    return ["--data", "umls", "--model", str(headless), "--data-dir", str(root / "data"), "--out", str(out),
            "--negatives", "1,1,1", "--batch", "6", "--lr", "3e-3", "--log-every", "1", "--dtype", "fp32", *extra]


@pytest.mark.parametrize("method", [m for m in METHODS if m != "palt"])
def test_train_py_trains_resumes_and_loads_back_each_method(setup, tmp_path, method, monkeypatch):
    """Stopped by a signal in its second epoch and resumed, a run ends where an uninterrupted one does; its checkpoint
    holds the trainable tensors only and loads back from Python to the same scores."""
    argv = lambda out, *extra: train.parse_args(cli(setup, out, "--epochs", "2", "--method", method, *extra))
    straight = train.main(argv(tmp_path / "straight"))
    signal_at_step(monkeypatch, 7)
    train.main(argv(tmp_path / "run"))
    monkeypatch.setattr(runlog, "STOP", [])
    model = train.main(argv(tmp_path / "run", "--resume"))
    assert "resumed from" in (tmp_path / "run" / "log.txt").read_text()
    for (name, a), b in zip(straight.named_parameters(), model.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0, msg=name)
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert set(load_file(tmp_path / "run" / "ckpt.safetensors")) == {checkpoints.stored_name(n) for n in trained}
    loaded, meta, _ = checkpoints.load_checkpoint(tmp_path / "run" / "ckpt.safetensors")
    assert meta["palt"]["method"] == method and json.loads(meta["run"])["method"] == method
    b = batch(prompts=loaded.cfg.prompts)
    with torch.no_grad():
        assert torch.equal(score(loaded.eval()(**b)), score(model.eval()(**b)))


@pytest.mark.parametrize("argv, message", [
    (["--method", "lora", "--prompts", "2,0,0"], "--method lora trains low-rank updates of q and v and none of "
                                                 "PALT's parts: drop --prompts"),
    (["--method", "bitfit", "--calib", "1", "--prompt-mlp"], "drop --calib and --prompt-mlp"),
    (["--method", "prompt", "--prompts", "0,0,0"], "--prompts 0,0,0 leaves none"),
    (["--finetune", "--method", "lora"], "--finetune is --method finetune"),
    (["--method", "bitfit", "--lora-rank", "4"], "--lora-rank and --lora-alpha shape --method lora's updates"),
    (["--lora-alpha", "8"], "not --method palt"),
    (["--method", "adapters"], "invalid choice"),
])
def test_a_contradictory_method_is_one_argparse_error(setup, capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        train.parse_args(["--data", "umls", "--data-dir", str(setup[0] / "data"), *argv])
    assert e.value.code == 2
    assert message in capsys.readouterr().err.splitlines()[-1]


def test_a_method_drops_the_recipes_palt_parts_and_prompt_tuning_takes_the_papers_prompts(setup):
    """The cpu recipe gives PALT 2,0,0 prompts: lora drops them silently (the recipe's, not the user's), prompt tuning
    keeps them, and under the tuned recipe (no prompts) prompt tuning takes the paper's 10,10,10."""
    data = ["--data", "umls", "--data-dir", str(setup[0] / "data")]
    lora = train.parse_args([*data, "--recipe", "cpu", "--method", "lora"])
    assert (lora.prompts, lora.calib, lora.no_wp, lora.lora_rank, lora.lora_alpha) == ((0, 0, 0), (), True, 8, 16.0)
    assert train.parse_args([*data, "--recipe", "cpu", "--method", "prompt"]).prompts == (2, 0, 0)
    assert train.parse_args([*data, "--recipe", "tuned", "--method", "prompt"]).prompts == (10, 10, 10)
    palt = train.parse_args([*data, "--recipe", "cpu"])
    assert (palt.method, palt.lora_rank, palt.finetune) == ("palt", None, False)
    assert train.parse_args([*data, "--finetune"]).method == "finetune"


def test_a_run_without_a_recipe_takes_tuned_for_a_model_without_an_nsp_head_and_says_so(setup, tmp_path, capsys):
    root, base, headless = setup
    data = ["--data", "umls", "--data-dir", str(root / "data")]
    assert train.parse_args([*data, "--model", str(base)]).recipe == "paper"
    run = train.parse_args([*data, "--model", str(headless)])
    assert run.recipe == "tuned" and (run.lr, run.batch) == (train.PRESETS["tuned"]["umls"]["lr"], 16)
    train.main(train.parse_args(cli(setup, tmp_path, "--epochs", "1")))
    out = capsys.readouterr().out
    assert "recipe tuned: headless has no pretrained NSP head" in out


def test_the_recipes_either_side_gives_way_to_negatives_given_on_the_command_line(setup):
    data = ["--data", "wn11", "--recipe", "tuned"]
    assert train.parse_args(data).either_side is True
    run = train.parse_args([*data, "--negatives", "1,1,1"])
    assert (run.negatives, run.either_side) == ((1, 1, 1), False)


def test_finetuning_takes_its_own_tuned_recipe_and_a_checkpoint_names_the_search_behind_it(setup, tmp_path):
    root, base, headless = setup
    data = ["--data", "umls", "--data-dir", str(root / "data"), "--model", str(headless)]
    run = train.parse_args([*data, "--method", "finetune"])
    assert run.recipe == "tuned-finetune" and (run.lr, run.negatives) == (2.49e-4, (5, 5, 5))
    assert "recipe tuned-finetune:" in run.recipe_note
    assert train.parse_args([*data, "--method", "lora"]).recipe == "tuned"  # no search of its own yet
    train.main(train.parse_args(cli(setup, tmp_path, "--epochs", "1", "--method", "finetune")))
    _, meta, _ = checkpoints.load_checkpoint(tmp_path / "ckpt.safetensors")
    assert meta["search"] == "results/tune-umls-finetune trial 12"
    train.main(train.parse_args(cli(setup, tmp_path / "cpu", "--epochs", "1", "--recipe", "cpu")))
    assert checkpoints.load_checkpoint(tmp_path / "cpu" / "ckpt.safetensors")[1]["search"] is None
    # a search's best trial trained again at another budget says so itself; the run's record leaves it out
    said = "results/tune-umls-lora trial 7"
    train.main(train.parse_args(cli(setup, tmp_path / "lora", "--epochs", "1", "--recipe", "cpu", "--method", "lora",
                                    "--search", said)))
    _, meta, _ = checkpoints.load_checkpoint(tmp_path / "lora" / "ckpt.safetensors")
    assert meta["search"] == said and "search" not in json.loads(meta["run"])
    assert evalcli.train_summary(meta)["search"] == said
