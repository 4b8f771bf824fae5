"""bert.py: exact parity with Hugging Face transformers, its tokenizer, the real MiniLM weights, bad checkpoints, downloads."""
import hashlib, http.server, json, random, subprocess, sys, threading
from pathlib import Path
import pytest
import torch
from safetensors.torch import save_file

from support import hub
from bert import CheckpointError, load_weights
from support.hf import load_tokenizer, read_config
from support.hub import load_bert

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
transformers = pytest.importorskip("transformers")


def load_folder(d):
    """bert.load_weights of a model folder's model.safetensors, with its config.json."""
    return load_weights(d / "model.safetensors", read_config(d / "config.json"))


def tiny_hf_config(**kw):
    return transformers.BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                                   intermediate_size=37, max_position_embeddings=64, type_vocab_size=2,
                                   layer_norm_eps=0.1, initializer_range=0.2, **kw)  # O(1) activations and an odd eps: tanh-GELU or a fixed eps would show


@pytest.fixture(scope="module")
def hf_model():
    torch.manual_seed(0)
    m = transformers.BertForPreTraining(tiny_hf_config()).eval()
    with torch.no_grad():  # move the LayerNorms off their (1, 0) init so a swapped weight/bias cannot pass
        for name, p in m.named_parameters():
            if "LayerNorm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return m


def save_layout(model, directory, legacy):
    """Save as HF does ("bert." prefix), or the old TF-converted way: no prefix, LayerNorm gamma/beta."""
    directory.mkdir(parents=True, exist_ok=True)
    sd = {k: v.clone() for k, v in model.state_dict().items() if k != "cls.predictions.decoder.weight"}
    if legacy:
        sd = {k.removeprefix("bert.").replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
              for k, v in sd.items()}
    save_file(sd, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(model.config.to_json_string())
    return directory


def padded_batch():
    torch.manual_seed(1)
    ids = torch.randint(5, 120, (3, 11))
    types = torch.zeros_like(ids)
    types[:, 6:] = 1
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0  # rows of different lengths; padding positions hold real-looking ids on purpose,
    mask[2, 4:] = 0  # so a model that masks by token id 0 instead of attention_mask fails
    return ids, types, mask


@pytest.mark.parametrize("legacy", [False, True])
def test_parity_with_transformers(hf_model, tmp_path, legacy):
    model, heads_to_train = load_folder(save_layout(hf_model, tmp_path / "m", legacy))
    assert heads_to_train == ()
    ids, types, mask = padded_batch()
    with torch.no_grad():
        ref = hf_model(input_ids=ids, token_type_ids=types, attention_mask=mask, output_hidden_states=True)
        ref_pooled = hf_model.bert(input_ids=ids, token_type_ids=types, attention_mask=mask).pooler_output
        out = model.eval()(ids, types, mask, output_hidden_states=True)
    torch.testing.assert_close(out.nsp_logits, ref.seq_relationship_logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.pooled, ref_pooled, atol=1e-5, rtol=0)
    assert len(out.hidden_states) == len(ref.hidden_states) == 4
    for ours, theirs, m in zip(out.hidden_states, ref.hidden_states, [mask] * 4):
        keep = m.bool()  # HF and we both compute padded positions, but only real ones are defined outputs
        torch.testing.assert_close(ours[keep], theirs[keep], atol=1e-5, rtol=0)


def test_inputs_embeds_equals_input_ids(hf_model, tmp_path):
    model, _ = load_folder(save_layout(hf_model, tmp_path / "m", False))
    ids, types, mask = padded_batch()
    with torch.no_grad():
        a = model.eval()(ids, types, mask).nsp_logits
        b = model(inputs_embeds=model.embeddings.word(ids), token_type_ids=types, attention_mask=mask).nsp_logits
    torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_missing_nsp_head_is_new_and_trainable(hf_model, tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    sd = {k: v.contiguous() for k, v in hf_model.bert.state_dict().items()}  # a BertModel: no "bert." prefix, no cls.*
    save_file(sd, str(d / "model.safetensors"))
    (d / "config.json").write_text(hf_model.config.to_json_string())
    model, heads_to_train = load_folder(d)
    assert heads_to_train == ("pooler", "nsp")
    assert not model.nsp.weight.is_meta and model.nsp.weight.abs().sum() > 0 and model.nsp.bias.abs().sum() == 0


# ------------------------------------------------------------------------------------------ tokenizer parity
def entity_texts(n=400):
    texts = []
    for name, file in [("FB15k-237", "entity2text.txt"), ("WN18RR", "entity2text.txt"), ("umls", "entity2textlong.txt"),
                       ("FB13", "entity2text_capital.txt")]:
        path = DATA / name / file
        if not path.is_file():
            pytest.skip(f"{path} not present")
        lines = [line.split("\t", 1)[1] for line in path.read_text(encoding="utf-8").splitlines() if "\t" in line]
        accented = [t for t in lines if not t.isascii()][: n // 8]  # accents and non-Latin scripts on purpose
        texts += accented + random.Random(0).sample(lines, n // 4 - len(accented))
    return texts + ["Zoë Saldaña (actress)", "São Paulo; F.C. -- 1920's", "naïve café", "C++/Java, e.g."]


def test_tokenizer_matches_hf_uncased(tmp_path):
    minilm = hub.model_dir("minilm")
    texts = entity_texts()
    ref = transformers.BertTokenizerFast(str(minilm / "vocab.txt"), do_lower_case=True)
    expected = [ref(t, add_special_tokens=False)["input_ids"] for t in texts]
    # via the shipped tokenizer.json, and via vocab.txt + tokenizer_config.json only
    (tmp_path / "vocab.txt").write_bytes((minilm / "vocab.txt").read_bytes())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    for tok in (load_tokenizer(minilm), load_tokenizer(tmp_path)):
        assert [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)] == expected
    assert any(e != [ref.unk_token_id] * len(e) for e in expected)


def test_tokenizer_matches_hf_cased(tmp_path):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    texts = entity_texts()
    # A cased WordPiece vocabulary trained here on the texts (the real bert-base-cased vocab cannot be downloaded).
    t = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    t.normalizer = normalizers.BertNormalizer(lowercase=False, strip_accents=False)
    t.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    t.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=2000, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
    for d in (tmp_path / "bert-tiny-cased", tmp_path / "with-config"):
        d.mkdir()
        t.model.save(str(d))
    (tmp_path / "with-config" / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    ref = transformers.BertTokenizerFast(str(tmp_path / "with-config" / "vocab.txt"), do_lower_case=False)
    expected = [ref(x, add_special_tokens=False)["input_ids"] for x in texts]
    for d in (tmp_path / "bert-tiny-cased", tmp_path / "with-config"):  # cased from the name, or from the config
        assert [e.ids for e in load_tokenizer(d).encode_batch(texts, add_special_tokens=False)] == expected
    vocab = (tmp_path / "with-config" / "vocab.txt").read_text().split()
    assert "Saldaña" in texts[-4] and any(w[0].isupper() for w in vocab)  # really cased


# -------------------------------------------------------------------------------------------- real MiniLM
def test_minilm_matches_transformers():
    loaded = load_bert("minilm")
    assert loaded.heads_to_train == ("pooler", "nsp") and loaded.config.hidden_size == 384
    ref = transformers.BertModel.from_pretrained(str(loaded.path), add_pooling_layer=False).eval()
    enc = [loaded.tokenizer.encode(a, b) for a, b in [("Paris", "capital of France"), ("a longer head entity text", "x")]]
    L = max(len(e.ids) for e in enc)
    ids = torch.tensor([e.ids + [0] * (L - len(e.ids)) for e in enc])
    types = torch.tensor([e.type_ids + [0] * (L - len(e.ids)) for e in enc])
    mask = torch.tensor([[1] * len(e.ids) + [0] * (L - len(e.ids)) for e in enc])
    with torch.no_grad():
        ours = loaded.model.eval()(ids, types, mask, output_hidden_states=True).hidden_states[-1]
        theirs = ref(input_ids=ids, token_type_ids=types, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(ours[mask.bool()], theirs[mask.bool()], atol=1e-4, rtol=0)


# ---------------------------------------------------------------------------------------- bad checkpoints
# (a missing folder or model.safetensors, a wrong shape, bad config.json: bert-check-* in test_cli_errors.py's CASES)
def test_bad_checkpoints(hf_model, tmp_path):
    good = save_layout(hf_model, tmp_path / "good", False)
    truncated = save_layout(hf_model, tmp_path / "truncated", False)
    data = (good / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="model.safetensors: not a readable safetensors file"):
        load_folder(truncated)

    def variant(name, edit):
        d = tmp_path / name
        d.mkdir()
        sd = {k: v.clone() for k, v in hf_model.state_dict().items() if k != "cls.predictions.decoder.weight"}
        edit(sd)
        save_file(sd, str(d / "model.safetensors"))
        (d / "config.json").write_text(hf_model.config.to_json_string())
        return d

    unknown = variant("unknown", lambda sd: sd.__setitem__("bert.encoder.layer.0.adapter.weight", torch.zeros(3)))
    with pytest.raises(CheckpointError, match="model.safetensors: unknown key 'bert.encoder.layer.0.adapter.weight'"):
        load_folder(unknown)
    absent = variant("absent", lambda sd: sd.pop("bert.encoder.layer.2.attention.self.key.bias"))
    with pytest.raises(CheckpointError, match="model.safetensors: missing key for layers.2.k.bias"):
        load_folder(absent)


def test_check_cli_reports_heads():
    r = subprocess.run([sys.executable, "-m", "support.hub", "--check", "minilm"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "22,713,986" in r.stdout and "nsp     NEW" in r.stdout and "P(is next" in r.stdout


# ------------------------------------------------------------------------------------------------ downloads
class Hub(http.server.BaseHTTPRequestHandler):
    """A stand-in for the hub: HEAD/GET on resolve/main answer like HF (LFS files redirect with X-Linked-*),
    the storage path honours Range so that downloads can resume."""
    files, sabotage, requests = {}, set(), []

    def log_message(self, *a):
        pass

    def do_HEAD(self):
        self.do_GET(body=False)

    def do_GET(self, body=True):
        name = self.path.rsplit("/", 1)[-1]
        self.requests.append((self.command, self.path, self.headers.get("Range")))
        if name not in self.files:
            return self.send_error(404)
        data = self.files[name]
        if "/resolve/main/" in self.path and name.endswith(".safetensors"):
            self.send_response(302)
            self.send_header("Location", f"/storage/{name}")
            self.send_header("X-Linked-Size", str(len(data)))
            self.send_header("X-Linked-Etag", f'"{hashlib.sha256(data).hexdigest()}"')
            self.send_header("Content-Length", "0")
            return self.end_headers()
        if name in self.sabotage:
            data = data[:-1] + bytes([data[-1] ^ 1])
        start = int(self.headers["Range"].split("=")[1].rstrip("-")) if self.headers.get("Range") else 0
        self.send_response(206 if start else 200)
        self.send_header("Content-Length", str(len(data) - start))
        self.end_headers()
        if body:
            self.wfile.write(data[start:])


@pytest.fixture
def fake_hub(hf_model, tmp_path, monkeypatch):
    src = save_layout(hf_model, tmp_path / "src", False)
    (src / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(115)]))
    (src / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    Hub.files = {f: (src / f).read_bytes() for f in hub.HUB_FILES}
    Hub.sabotage, Hub.requests = set(), []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(hub, "HUB", f"http://127.0.0.1:{server.server_port}")
    monkeypatch.setattr(hub, "WEIGHTS", tmp_path / "weights")
    yield server
    server.shutdown()


def test_download_resumes_and_verifies(fake_hub, hf_model, tmp_path):
    target = tmp_path / "weights" / "bert-base-cased"
    target.mkdir(parents=True)
    blob = Hub.files["model.safetensors"]
    (target / "model.safetensors.part").write_bytes(blob[:1000])  # an interrupted earlier download
    loaded = load_bert("bert-base-cased")
    assert (target / "model.safetensors").read_bytes() == blob and not list(target.glob("*.part"))
    assert ("GET", "/storage/model.safetensors", "bytes=1000-") in Hub.requests  # it resumed, not restarted
    assert loaded.weights_sha256 == hashlib.sha256(blob).hexdigest() and loaded.heads_to_train == ()


def test_download_rejects_corrupt_file(fake_hub, tmp_path):
    Hub.sabotage = {"model.safetensors"}
    with pytest.raises(CheckpointError, match="sha256 [0-9a-f]+ is not the expected [0-9a-f]+; nothing written"):
        load_bert("bert-large-cased")
    target = tmp_path / "weights" / "bert-large-cased"
    assert not (target / "model.safetensors").exists() and not list(target.glob("*.part"))


def test_download_offline_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(hub, "HUB", "http://127.0.0.1:9")  # discard port: connection refused
    monkeypatch.setattr(hub, "WEIGHTS", tmp_path / "weights")
    with pytest.raises(CheckpointError, match=r"cannot download .* into .*bert-base-uncased/"):
        load_bert("bert-base-uncased")


def test_nsp_head_runs_in_fp32_under_bf16_autocast(hf_model, tmp_path):
    """bf16 logits keep 3 significant digits: ranking thousands of candidates on them would manufacture ties."""
    model, _ = load_folder(save_layout(hf_model, tmp_path / "m", False))
    ids, types, mask = padded_batch()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = model.eval()(ids, types, mask)
    assert out.nsp_logits.dtype == out.pooled.dtype == torch.float32


def test_dropout_drops_at_rate_p_and_keeps_the_mean():
    """bert.dropout's 16-bit masks: each element dropped with probability p (to 1/65536), the kept ones scaled so the
    mean is kept; seeded by torch's generator; off in eval and at p = 0; every 16-bit lane of a draw as random."""
    from bert import dropout
    x = torch.ones(1000, 1003)  # an odd count: the last 64-bit draw is cut short
    torch.manual_seed(0)
    y = dropout(x, 0.1, True)
    dropped = (y == 0).float()
    assert abs(dropped.mean().item() - 0.1) < 0.002
    assert abs(y.mean().item() - 1) < 0.003
    assert torch.allclose(y[y != 0], torch.tensor(65536 / (65536 - 6554)))  # the inverse of the keep probability
    for lane in range(4):  # four masks from each 64-bit draw: none biased (a sign bit left 0 would drop none)
        assert abs(dropped.view(-1)[lane::4].mean().item() - 0.1) < 0.004, lane
    torch.manual_seed(0)
    assert torch.equal(dropout(x, 0.1, True), y)
    assert not torch.equal(dropout(x, 0.1, True), y)
    assert dropout(x, 0.1, False) is x and dropout(x, 0.0, True) is x
    xb = torch.ones(10, 10, dtype=torch.bfloat16, requires_grad=True)
    yb = dropout(xb, 0.5, True)
    yb.sum().backward()
    assert yb.dtype == torch.bfloat16 and torch.equal(xb.grad, yb.detach())  # the gradient passes the same mask


def test_attention_written_out_equals_sdpa():
    """In CPU training bert.attend writes attention out to draw its dropout with bert.dropout: with nothing dropped it is
    SDPA's attention, padded keys masked, forward and backward; with p > 0 it drops weights, not whole rows."""
    from bert import attend, sdpa_mask
    torch.manual_seed(0)
    q, k, v = (torch.randn(3, 2, 7, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    mask = sdpa_mask(torch.tensor([[1] * 7, [1] * 4 + [0] * 3, [1] * 2 + [0] * 5]))
    written = attend(q, k, v, mask, 1e-9)  # p rounds to 0 of 65536: the written-out path, nothing dropped
    grads = torch.autograd.grad(written.sum(), (q, k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    ref_grads = torch.autograd.grad(ref.sum(), (q, k, v))
    assert torch.allclose(written, ref, atol=1e-12)
    assert all(torch.allclose(g, r, atol=1e-12) for g, r in zip(grads, ref_grads))
    torch.manual_seed(1)
    ones = torch.ones(1, 1, 7, 1, dtype=torch.float64)
    dropped = attend(q[:1, :1], k[:1, :1], ones, None, 0.5)  # each row: the kept weights' sum / 0.5
    assert not torch.allclose(dropped, torch.ones_like(dropped))  # weights dropped ...
    assert (dropped > 0).all()  # ... not whole rows, at 7 keys a row (all 7 dropped: 0.5^7 a row; seeded)


@pytest.mark.parametrize("bad, message", [
    (dict(hidden_act="relu"), "only hidden_act=gelu and absolute positions"),
    (dict(hidden_dropout_prob=1.0), "a dropout probability must be below 1"),
    (dict(attention_probs_dropout_prob=-0.1), "attention_probs_dropout_prob must be a non-negative number"),
    (dict(num_attention_heads=5), "hidden_size 32 is not a multiple of num_attention_heads 5"),
])
def test_bad_configs_get_one_line(tmp_path, bad, message):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(tiny_hf_config().to_dict() | bad))
    with pytest.raises(CheckpointError, match=message):
        read_config(path)
