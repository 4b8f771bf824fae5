"""A Hugging Face model folder's files besides the weights: config.json read in one-line errors, and
the WordPiece tokenizer from tokenizer.json or vocab.txt (bert.load_bert calls both)."""
import json
from pathlib import Path

from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

from support.files import readable


class CheckpointError(ValueError):
    """A model file that cannot be used; the message is one line naming the file (and key)."""


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


def load_tokenizer(model_dir):
    """WordPiece tokenizer from tokenizer.json or vocab.txt, lower-casing/accents as the checkpoint
    was trained."""
    d = Path(model_dir)
    if (d / "tokenizer.json").is_file():
        tok = Tokenizer.from_file(readable(d / "tokenizer.json", CheckpointError))
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
    # shipped tokenizer.json files may pad/truncate to a fixed length; we do our own
    tok.no_padding()
    tok.no_truncation()
    return tok
