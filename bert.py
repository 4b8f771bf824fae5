"""A minimal BERT in pure PyTorch (post-LN, exact erf GELU, F.scaled_dot_product_attention, pooler
and NSP head) that loads the original Hugging Face weights. The first smoke test for a model:
`python -m support.hub --check NAME_OR_PATH`."""
import math
import re
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors import SafetensorError, safe_open

from support.errors import CheckpointError
from support.files import readable


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    initializer_range: float = 0.02


# ----------------------------------------------------------------------------- the model
def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Inverted dropout. On a CPU the keep mask comes from 16-bit random integers, four to each
    64-bit draw, because torch's CPU dropout draws a whole float an element (bernoulli_), which
    costs more than the bits it needs (RESULTS.md times both). An element is dropped with
    probability round(65536 p) / 65536 (0.1 -> 0.100006) and the kept ones scaled by the inverse of
    the keep probability."""
    if not training or p == 0:
        return x
    if x.device.type != "cpu" or torch.compiler.is_compiling():
        return F.dropout(x, p, True)  # Torch's own dropout is fast on a GPU and when compiled.
    n, cut = x.numel(), round(p * 65536)
    bits = torch.empty((n + 3) // 4, dtype=torch.int64, device=x.device)
    bits.random_(-2**63, None)  # All 64 bits are uniform; random_() leaves the sign bit 0.
    keep = bits.view(torch.int16)[:n].view(x.shape) >= cut - 32768  # (n,) 16-bit lanes -> x.shape
    # The mask is scaled in x's dtype, as torch's CPU dropout makes it; a torch.where is slower.
    return x * (keep.to(x.dtype) * (65536 / (65536 - cut)))


def attention_weights(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """softmax(q k^T / sqrt(d_head) + mask): (B, n_head, L, L), a masked key's weight 0."""
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5  # (B, n_head, L, L)
    if mask is not None:
        s = s.masked_fill(~mask, -math.inf)
    return s.softmax(-1)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
           p: float) -> torch.Tensor:
    """softmax(q k^T / sqrt(d_head), masked keys) v, dropout p on the attention weights: (B, n_head,
    L, d_head). F.scaled_dot_product_attention does it all, but on a CPU its dropout is torch's
    (see dropout); there, in training, the same maths is written out with dropout() on the weights,
    so that the cheaper mask serves attention too (RESULTS.md, Speed and precision, times it)."""
    if p == 0 or q.device.type != "cpu" or torch.compiler.is_compiling():
        return F.scaled_dot_product_attention(query=q, key=k, value=v, attn_mask=mask, dropout_p=p)
    return dropout(attention_weights(q, k, mask), p, True) @ v


class Embeddings(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.word = nn.Embedding(c.vocab_size, c.hidden_size)
        self.position = nn.Embedding(c.max_position_embeddings, c.hidden_size)
        self.token_type = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.ln = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.p_drop = c.hidden_dropout_prob

    def forward(self, input_ids: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None,
                inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        """word (or given) + position + token type embeddings, LayerNorm, dropout: (B, L, H)."""
        x = self.word(input_ids) if inputs_embeds is None else inputs_embeds  # (B, L, H)
        if token_type_ids is None:
            token_type_ids = torch.zeros(x.shape[:2], dtype=torch.long, device=x.device)
        positions = torch.arange(x.shape[1], device=x.device)
        x = self.ln(x + self.position(positions) + self.token_type(token_type_ids))
        return dropout(x, self.p_drop, self.training)


class Layer(nn.Module):
    """One post-LN encoder layer, split into its two sublayers so that PALT can act between them."""

    def __init__(self, c: BertConfig):
        super().__init__()
        H = c.hidden_size
        self.n_head, self.p_attn = c.num_attention_heads, c.attention_probs_dropout_prob
        self.p_drop = c.hidden_dropout_prob
        self.q, self.k, self.v, self.attn_out = (nn.Linear(H, H) for _ in range(4))
        self.ln1 = nn.LayerNorm(H, eps=c.layer_norm_eps)
        self.ffn_in = nn.Linear(H, c.intermediate_size)
        self.ffn_out = nn.Linear(c.intermediate_size, H)
        self.ln2 = nn.LayerNorm(H, eps=c.layer_norm_eps)

    def attention(self, h: torch.Tensor, mask: torch.Tensor | None,
                  weights: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Multi-head self-attention, residual, LayerNorm: (B, L, H), and with weights=True the
        attention weights it applies, attention_weights of its own q and k (else None)."""
        B, L, H = h.shape
        # (B, L, H) -> (B, n_head, L, d_head)
        q, k, v = (x(h).view(B, L, self.n_head, H // self.n_head).transpose(1, 2)
                   for x in (self.q, self.k, self.v))
        w = attention_weights(q, k, mask) if weights else None
        a = attend(q=q, k=k, v=v, mask=mask, p=self.p_attn if self.training else 0.0)
        a = a.transpose(1, 2).reshape(B, L, H)  # (B, n_head, L, d_head) -> (B, L, H)
        return self.ln1(h + dropout(self.attn_out(a), self.p_drop, self.training)), w

    def feed_forward(self, h: torch.Tensor) -> torch.Tensor:
        """The feed-forward sublayer, residual, LayerNorm; F.gelu is the exact erf GELU."""
        ffn = self.ffn_out(F.gelu(self.ffn_in(h)))
        return self.ln2(h + dropout(ffn, self.p_drop, self.training))

    def forward(self, h: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        return self.feed_forward(self.attention(h, mask)[0])


@dataclass
class BertOutput:
    nsp_logits: torch.Tensor  # (B, 2); class 0 = "B follows A" = a true triple
    pooled: torch.Tensor  # (B, H)
    hidden_states: tuple | None  # embeddings output, then every layer's output


def autocast(precision: str, device: str | torch.device) -> torch.autocast:
    """The precision a model runs in: 'bf16' autocasts the matmuls to bf16, 'fp32' switches
    autocast off (also an outer one). The NSP head stays fp32 either way (Bert.nsp_head)."""
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16,
                          enabled=precision == "bf16")


def sdpa_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """(B, L) 1 for real tokens -> (B, 1, 1, L) bool for SDPA, True where a key may be attended
    (never from token id 0)."""
    return None if attention_mask is None else attention_mask.bool()[:, None, None, :]


class Bert(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList(Layer(config) for _ in range(config.num_hidden_layers))
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size)
        self.nsp = nn.Linear(config.hidden_size, 2)

    def nsp_head(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(NSP logits, pooled) of x (B, H), the last layer's [CLS] state as BERT reads it, in fp32
        even under bf16 autocast: bf16 logits (3 significant digits) would turn close scores into
        ties."""
        with torch.autocast(x.device.type, enabled=False):
            pooled = torch.tanh(self.pooler(x.float()))
            return self.nsp(pooled), pooled

    def forward(self, input_ids: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None,
                inputs_embeds: torch.Tensor | None = None,
                output_hidden_states: bool = False) -> BertOutput:
        """The encoder over a batch: NSP logits, the pooled [CLS] state and, if asked, every
        layer's output."""
        h = self.embeddings(input_ids, token_type_ids, inputs_embeds)
        mask, hidden = sdpa_mask(attention_mask), [h]
        for layer in self.layers:
            h = layer(h, mask)
            hidden.append(h)
        nsp_logits, pooled = self.nsp_head(h[:, 0])  # [CLS]
        return BertOutput(nsp_logits, pooled, tuple(hidden) if output_hidden_states else None)


# ------------------------------------------------------------------- loading Hugging Face's weights
# Hugging Face name (an optional "bert." prefix dropped, legacy gamma/beta renamed) -> ours
LAYER = r"encoder\.layer\.(\d+)\."
NAME_TABLE = [
    (r"embeddings\.word_embeddings\.weight", "embeddings.word.weight"),
    (r"embeddings\.position_embeddings\.weight", "embeddings.position.weight"),
    (r"embeddings\.token_type_embeddings\.weight", "embeddings.token_type.weight"),
    (r"embeddings\.LayerNorm\.(weight|bias)", r"embeddings.ln.\1"),
    (LAYER + r"attention\.self\.query\.(weight|bias)", r"layers.\1.q.\2"),
    (LAYER + r"attention\.self\.key\.(weight|bias)", r"layers.\1.k.\2"),
    (LAYER + r"attention\.self\.value\.(weight|bias)", r"layers.\1.v.\2"),
    (LAYER + r"attention\.output\.dense\.(weight|bias)", r"layers.\1.attn_out.\2"),
    (LAYER + r"attention\.output\.LayerNorm\.(weight|bias)", r"layers.\1.ln1.\2"),
    (LAYER + r"intermediate\.dense\.(weight|bias)", r"layers.\1.ffn_in.\2"),
    (LAYER + r"output\.dense\.(weight|bias)", r"layers.\1.ffn_out.\2"),
    (LAYER + r"output\.LayerNorm\.(weight|bias)", r"layers.\1.ln2.\2"),
    (r"pooler\.dense\.(weight|bias)", r"pooler.\1"),
    (r"cls\.seq_relationship\.(weight|bias)", r"nsp.\1"),
]
# the MLM head (unused by PALT) and a constant buffer
IGNORED = [r"cls\.predictions\..*", r"embeddings\.position_ids"]


def our_name(hf_key: str) -> str | None:
    """Our parameter name for a checkpoint key; None if it is on the ignore list; KeyError if
    unknown."""
    key = re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", hf_key)
    key = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", key)
    key = key.removeprefix("bert.")
    if any(re.fullmatch(p, key) for p in IGNORED):
        return None
    for pattern, ours in NAME_TABLE:
        if re.fullmatch(pattern, key):
            return re.sub(pattern, ours, key)
    raise KeyError(hf_key)


def read_tensors(path: str) -> tuple[dict, dict]:
    """({our name: fp32 tensor}, {our name: checkpoint key}) of a model.safetensors."""
    try:
        with safe_open(readable(path, CheckpointError), framework="pt") as f:
            names = {our_name(key): key for key in f.keys()}
            names.pop(None, None)  # the ignored keys
            tensors = {name: f.get_tensor(key).float() for name, key in names.items()}
    except KeyError as e:
        raise CheckpointError(f"{path}: unknown key {e.args[0]!r} (not in bert.py's NAME_TABLE or "
                              "IGNORED)") from None
    except SafetensorError as e:
        raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from None
    return tensors, names


def load_weights(path: str, config: BertConfig) -> tuple[Bert, tuple]:
    """(Bert in fp32, heads_to_train): strictly from a model.safetensors, shape by shape. Without an
    NSP head, heads_to_train is ("pooler", "nsp"): the NSP head starts random, the pooler from the
    checkpoint where it has one (MiniLM does), else random; PALT trains both."""
    tensors, names = read_tensors(path)
    with torch.device("meta"):
        model = Bert(config)
    # BERT's pooler was pretrained with its NSP head; without that head (sentence-embedding models)
    # it has to learn NSP too.
    heads_to_train = () if "nsp.weight" in tensors else ("pooler", "nsp")
    for name, p in model.state_dict().items():
        if name not in tensors and name.split(".")[0] in heads_to_train and name.endswith("bias"):
            tensors[name] = torch.zeros(p.shape)  # BERT's initialisation
        elif name not in tensors and name.split(".")[0] in heads_to_train:
            tensors[name] = torch.randn(p.shape) * config.initializer_range
        elif name not in tensors:
            raise CheckpointError(f"{path}: missing key for {name}")
        elif tensors[name].shape != p.shape:
            shape = tuple(tensors[name].shape)
            raise CheckpointError(f"{path}: key {names[name]!r} has shape {shape}, "
                                  f"the config asks for {tuple(p.shape)}")
    model.load_state_dict(tensors, strict=True, assign=True)
    return model, heads_to_train
