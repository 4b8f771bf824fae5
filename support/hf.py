"""A Hugging Face model folder's files besides the weights: config.json read into a BertConfig in
one-line errors, and the WordPiece tokenizer from tokenizer.json or vocab.txt (hub.load_bert calls
both)."""
import json
from dataclasses import fields
from pathlib import Path

from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

from bert import BertConfig, CheckpointError
from support.files import readable

SPECIAL_TOKENS = ("[CLS]", "[SEP]", "[PAD]")  # what a sentence pair needs (data.encode)


def read_json(path):
    """The JSON object in a file, or CheckpointError in one line."""
    raw = Path(readable(path, CheckpointError)).read_bytes()
    try:
        d = json.loads(raw)
    except ValueError as e:  # not UTF-8, not JSON
        raise CheckpointError(f"{path}: not a readable JSON file ({e})") from None
    if not isinstance(d, dict):
        raise CheckpointError(f"{path}: not a JSON object")
    return d


def read_config(path):
    """The BertConfig of a Hugging Face BERT's config.json, every value checked."""
    d = read_json(path)
    act, pos = d.get("hidden_act", "gelu"), d.get("position_embedding_type", "absolute")
    if act != "gelu" or pos != "absolute":
        raise CheckpointError(f"{path}: only hidden_act=gelu and absolute positions are BERT as "
                              "implemented here")
    c = BertConfig(**{f.name: d[f.name] for f in fields(BertConfig) if f.name in d})
    for name, value in vars(c).items():
        if not isinstance(value, (int, float)) or value < 0:
            raise CheckpointError(f"{path}: {name} must be a non-negative number, not {value!r}")
    if max(c.hidden_dropout_prob, c.attention_probs_dropout_prob) >= 1:
        raise CheckpointError(f"{path}: a dropout probability must be below 1")
    if c.num_attention_heads < 1 or c.hidden_size % c.num_attention_heads:
        raise CheckpointError(f"{path}: hidden_size {c.hidden_size} is not a multiple of "
                              f"num_attention_heads {c.num_attention_heads}")
    return c


def load_tokenizer(model_dir):
    """WordPiece tokenizer from tokenizer.json or vocab.txt, lower-casing/accents as the checkpoint
    was trained."""
    d = Path(model_dir)
    if (d / "tokenizer.json").is_file():
        path = readable(d / "tokenizer.json", CheckpointError)
        try:
            tok = Tokenizer.from_file(path)
        except Exception as e:  # tokenizers raises a bare Exception for any file it cannot read
            raise CheckpointError(f"{path}: not a tokenizer file ({e})") from None
    elif (d / "vocab.txt").is_file():
        conf = {}
        if (d / "tokenizer_config.json").is_file():
            conf = read_json(d / "tokenizer_config.json")
        vocab = readable(d / "vocab.txt", CheckpointError)
        tok = Tokenizer(models.WordPiece.from_file(vocab, unk_token="[UNK]"))
        # Without a tokenizer config, an uncased model is recognised by its name (HF's own
        # convention); strip_accents=None means "strip when lower-casing", as in BERT's original
        # BasicTokenizer.
        lowercase = conf.get("do_lower_case", "uncased" in d.name.lower())
        tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase,
                                                    strip_accents=conf.get("strip_accents"))
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    else:
        raise CheckpointError(f"{d}: neither tokenizer.json nor vocab.txt")
    # A tokenizer without BERT's special tokens cannot build a sentence pair: refused at load.
    missing = [t for t in SPECIAL_TOKENS if tok.token_to_id(t) is None]
    if missing:
        raise CheckpointError(f"{d}: the tokenizer lacks {', '.join(missing)}")
    # shipped tokenizer.json files may pad/truncate to a fixed length; we do our own
    tok.no_padding()
    tok.no_truncation()
    return tok
