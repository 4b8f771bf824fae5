"""palt.py: zero-init PALT is plain BERT, only PALT parts train, the paper's parameter count, checkpoints."""
import pytest
import torch
from safetensors.torch import load_file

from bert import Bert, BertConfig, CheckpointError
from support.hub import load_bert
from conftest import make_bert_dir
from support.checkpoints import load_checkpoint, save_checkpoint
from palt import PALT, PaltConfig, default_calib_layers, param_report
from support.errors import ConfigError

WORDS = [f"w{i}" for i in range(40)]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return make_bert_dir(tmp_path_factory.mktemp("bert"), WORDS, layers=4)


def batch(prompts=(0, 0, 0), seed=0):
    """Random token ids with prompt slots after [CLS], before the first [SEP] and before the last [SEP]."""
    g = torch.Generator().manual_seed(seed)
    b, m, e = prompts
    ids = torch.randint(5, 45, (3, 12), generator=g)
    rows = []
    for row in ids:
        rows.append([2] + [0] * b + row[:5].tolist() + [0] * m + [3] + row[5:9].tolist() + [0] * e + [3])
    ids = torch.tensor(rows)
    prompt_index = torch.full_like(ids, -1)
    slots = [*range(1, 1 + b), *range(6 + b, 6 + b + m), *range(11 + b + m, 11 + b + m + e)]
    prompt_index[:, slots] = torch.arange(b + m + e)
    types = (torch.arange(ids.shape[1]) > 6 + b + m - 1).long().expand_as(ids).clone()
    mask = torch.ones_like(ids)
    mask[1, -3:] = 0  # a padded row
    return dict(input_ids=ids, token_type_ids=types, attention_mask=mask, prompt_index=prompt_index)


def test_zero_init_palt_without_prompts_is_exactly_bert(base):
    loaded = load_bert(base)
    palt = PALT(loaded.model, PaltConfig(prompts=(0, 0, 0))).eval()
    x = batch()
    with torch.no_grad():
        ref = loaded.model(x["input_ids"], x["token_type_ids"], x["attention_mask"]).nsp_logits
        assert torch.equal(palt(**x), ref)  # W_p and W_c are zero: bit for bit the same computation
        palt.W_c["3"].weight.add_(torch.randn(32, 32) * 0.1)  # and the calibration really is in the path
        assert not torch.allclose(palt(**x), ref)


def test_a_head_that_reads_the_mean_reads_the_last_layers_mean_over_the_real_tokens(base):
    """head_input='mean': the NSP head reads the mean of the last layer's states over the tokens the mask keeps (the
    state MiniLM was trained to produce), not [CLS]'s; padding does not move it; anything else is refused."""
    loaded = load_bert(base)
    palt = PALT(loaded.model, PaltConfig(prompts=(0, 0, 0), head_input="mean")).eval()
    x = batch()
    with torch.no_grad():
        out = loaded.model(x["input_ids"], x["token_type_ids"], x["attention_mask"], output_hidden_states=True)
        h, keep = out.hidden_states[-1], x["attention_mask"].float()
        mean = (h * keep[..., None]).sum(1) / keep.sum(1, keepdim=True)
        torch.testing.assert_close(palt(**x), loaded.model.nsp_head(mean)[0], atol=1e-6, rtol=0)
        assert not torch.allclose(palt(**x), out.nsp_logits)  # [CLS]'s head reads something else
        real = x["attention_mask"][1].bool()  # the padded row alone, its padding cut: the same score
        alone = {k: v[1:2, real] for k, v in x.items()}
        torch.testing.assert_close(palt(**alone), palt(**x)[1:2], atol=1e-5, rtol=0)
        unmasked = dict(x, attention_mask=None)  # the Scorer leaves out the mask where no row is padded
        torch.testing.assert_close(palt(**unmasked)[[0, 2]], palt(**x)[[0, 2]], atol=1e-6, rtol=0)
    with pytest.raises(ConfigError, match="head_input must be cls or mean, not 'max'"):
        PALT(loaded.model, PaltConfig(head_input="max"))


def test_prompts_are_inserted_at_their_slots(base):
    """Prompt vectors equal to some tokens' embeddings must give BERT's output on those tokens."""
    loaded = load_bert(base)
    palt = PALT(loaded.model, PaltConfig(prompts=(2, 1, 3))).eval()
    x = batch((2, 1, 3))
    tokens = torch.tensor([7, 8, 9, 10, 11, 12])
    with torch.no_grad():
        palt.P.copy_(loaded.model.embeddings.word(tokens))
        ids = torch.where(x["prompt_index"] >= 0, tokens[x["prompt_index"].clamp(min=0)], x["input_ids"])
        ref = loaded.model(ids, x["token_type_ids"], x["attention_mask"]).nsp_logits
        torch.testing.assert_close(palt(**x), ref, atol=1e-6, rtol=0)


def test_only_palt_parameters_get_gradients(base):
    loaded = load_bert(base)
    palt = PALT(loaded.model, PaltConfig(prompts=(2, 1, 1), prompt_mlp=True))
    palt(**batch((2, 1, 1))).sum().backward()
    got = {n for n, p in palt.named_parameters() if p.grad is not None}
    assert got == {n for n, p in palt.named_parameters() if not n.startswith("bert.")}
    assert {"P", "W_p.weight", "W_c.2.weight", "W_c.3.bias", "prompt_mlp.0.weight"} <= got


def test_heads_to_train_train_and_finetune_trains_everything(base, tmp_path):
    headless = load_bert(make_bert_dir(tmp_path / "headless", WORDS, nsp=False))
    assert headless.heads_to_train == ("pooler", "nsp")
    palt = PALT(headless.model, PaltConfig(prompts=(1, 0, 0), calib_layers=()), headless.heads_to_train)
    trainable = {n for n, p in palt.named_parameters() if p.requires_grad}
    assert trainable == {"P", "W_p.weight", "W_p.bias", "bert.pooler.weight", "bert.pooler.bias",
                         "bert.nsp.weight", "bert.nsp.bias"}


def test_finetune_trains_the_lm_and_nothing_else_whatever_calib_layers_holds(base):
    """calib_layers=None means the middle and last layer for PALT, and no calibration under method='finetune':
    finetune never quietly trains a PALT part beside the LM."""
    for calib_layers in (None, ()):
        ft = PALT(load_bert(base).model, PaltConfig(method="finetune", calib_layers=calib_layers))
        assert ft.calib_layers == () and len(ft.W_c) == 0 and ft.P is None and ft.W_p is None
        assert all(p.requires_grad for p in ft.parameters())
        assert list(param_report(ft)["parts"]) == ["bert", "bert.pooler", "bert.nsp"]
        assert param_report(ft)["percent"] == 100


@pytest.mark.parametrize("part", [dict(calib_layers=(1,)), dict(prompts=(1, 0, 0)), dict(prompt_encoder=True),
                                  dict(prompt_mlp=True)])
def test_finetune_with_a_palt_part_is_refused_in_one_line(base, part):
    cfg = PaltConfig(**(dict(method="finetune") | part))
    with pytest.raises(ConfigError, match=r"^PaltConfig\(method='finetune'\) has no ") as e:
        PALT(load_bert(base).model, cfg)
    assert "\n" not in str(e.value)


def test_parameter_count_matches_the_paper_for_bert_base():
    """n_p*d_e + d_e*d_h + 2*d_h*d_h = 1,771,008 weights for 2 prompts, W_p and W_c at layers 6 and 11;
    we keep the biases b_p, b_c of Eq. 1 and 2: 3 * 768 more."""
    with torch.device("meta"):
        bert = Bert(BertConfig())  # the bert-base shape, no download
    palt = PALT(bert, PaltConfig(prompts=(2, 0, 0)))
    r = param_report(palt)
    assert palt.calib_layers == default_calib_layers(12) == (6, 11)  # the middle and the last, from 0
    assert default_calib_layers(6) == (3, 5)  # MiniLM's
    assert r["tunable"] == 2 * 768 + 768 * 768 + 2 * 768 * 768 + 3 * 768 == 1_771_008 + 2_304
    assert r["total"] - r["tunable"] == 109_483_778  # BertForPreTraining's encoder, pooler and NSP head
    assert round(r["percent"], 1) == 1.6
    with torch.device("meta"):
        large = Bert(BertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096))
    assert PALT(large, PaltConfig()).calib_layers == (12, 23)


def test_checkpoint_roundtrip_and_wrong_base(base, tmp_path):
    loaded = load_bert(base)
    palt = PALT(loaded.model, PaltConfig(prompts=(2, 1, 3))).eval()
    with torch.no_grad():
        for p in (palt.P, palt.W_p.weight, palt.W_c["3"].weight):
            p.add_(torch.randn_like(p) * 0.05)
    x = batch((2, 1, 3))
    meta = {"model": str(base), "weights_sha256": loaded.weights_sha256, "data": "umls", "data_fingerprint": "f",
            "text": "name", "prompts": [2, 1, 3], "max_seq_length": 64}
    save_checkpoint(tmp_path / "c.safetensors", palt, meta)
    # the file names P and W_c as the shipped adapters do: "prompts" and "calib.<layer>"
    assert set(load_file(tmp_path / "c.safetensors")) == {"prompts", "W_p.weight", "W_p.bias", "calib.2.weight",
                                                          "calib.2.bias", "calib.3.weight", "calib.3.bias"}
    back, back_meta, _ = load_checkpoint(tmp_path / "c.safetensors")
    with torch.no_grad():
        assert torch.equal(back.eval()(**x), palt(**x))
    assert back_meta["data"] == "umls" and back_meta["palt"]["prompts"] == [2, 1, 3]
    size = (tmp_path / "c.safetensors").stat().st_size
    assert size < 4 * (6 * 32 + 3 * (32 * 32 + 32)) + 4096  # trainable tensors only, not the frozen BERT
    other = make_bert_dir(tmp_path / "other", WORDS, layers=4, seed=1)
    with pytest.raises(CheckpointError, match="wrong base model"):
        load_checkpoint(tmp_path / "c.safetensors", model=other)
    (tmp_path / "bad.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}garbage")
    with pytest.raises(CheckpointError, match="not a PALT checkpoint"):
        load_checkpoint(tmp_path / "bad.safetensors")


def test_every_unreadable_file_says_permission_denied_not_missing(base, tmp_path, monkeypatch):
    """Every file is opened through files.readable first (safetensors and tokenizers call any failed open "not
    found"): a model file, a data file and a checkpoint without read permission say so in one line. Root reads
    any file, so open() is mocked to refuse one."""
    import builtins, shutil, evaluate
    from support import files
    from conftest import write_tiny_kg
    from data import DataError
    from support.graphs import load_kg
    model = shutil.copytree(base, tmp_path / "m")
    loaded = load_bert(model)
    ckpt = tmp_path / "c.safetensors"
    save_checkpoint(ckpt, PALT(loaded.model, PaltConfig(prompts=(1, 0, 0))), {
        "model": str(model), "weights_sha256": loaded.weights_sha256, "data": "umls", "data_fingerprint": "f",
        "text": "name", "prompts": [1, 0, 0], "max_seq_length": 64})
    write_tiny_kg(tmp_path)
    (model / "tokenizer.json").write_text(loaded.tokenizer.to_str())  # read instead of vocab.txt and its config
    cases = [(model / "model.safetensors", lambda: load_bert(model), CheckpointError),
             (model / "config.json", lambda: load_bert(model), CheckpointError),
             (model / "tokenizer.json", lambda: load_bert(model), CheckpointError),
             (tmp_path / "umls" / "dev.tsv", lambda: load_kg("umls", tmp_path), DataError),
             (ckpt, lambda: load_checkpoint(ckpt), CheckpointError),
             (ckpt, lambda: evaluate.main(["--lp", "--ckpt", str(ckpt)]), SystemExit)]  # before anything loads
    for target, read, error in cases:
        def refuse(file, *a, **k):  # what open() does for a file without read permission (root ignores the bits)
            if str(file) == str(target):
                raise PermissionError(13, "Permission denied", str(file))
            return builtins.open(file, *a, **k)
        monkeypatch.setattr(files, "open", refuse, raising=False)
        with pytest.raises(error) as e:
            read()
        assert str(e.value).removeprefix("error: ") == f"{target}: cannot read it (permission denied)", target


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CPU's precision")
def test_bf16_on_a_cpu_without_native_bf16_warns_in_one_line(monkeypatch, capsys):
    from support import devices
    monkeypatch.setattr(devices, "cpu_has_native_bf16", lambda: False)
    assert devices.start_processes("bf16").dtype == "bf16"
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("warning: this CPU has no native bf16") and "emulated" in line
    assert devices.start_processes("fp32").dtype == "fp32" and capsys.readouterr().err == ""


def test_a_precision_or_text_not_known_is_one_of_the_projects_errors_in_one_line():
    from pathlib import Path
    from support import devices, graphs
    from support.errors import ERRORS
    with pytest.raises(ERRORS, match=r"^--dtype must be one of auto, fp32, bf16, not 'fp16'$"):
        devices.resolve_dtype("fp16", "cpu")
    with pytest.raises(ERRORS, match=r"^--text must be one of name, long, description, not 'x'$"):
        graphs.load_kg(Path(__file__).parent / "example_kg", text="x")
