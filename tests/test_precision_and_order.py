"""Mixed precision and length-bucketed training order: what bf16 keeps exact (the choices `--dtype auto` makes:
test_dtype.py), and an epoch order that is a permutation, the same on every rank, and padded little."""
import numpy as np
import torch

from support import hub
import train
from bert import autocast
from conftest import make_bert_dir
from palt import PALT, PaltConfig


def test_fp32_is_the_exact_path_even_inside_an_outer_bf16_autocast(tmp_path):
    base = make_bert_dir(tmp_path / "bert", [f"w{i}" for i in range(30)], layers=2)
    model = PALT(hub.load_bert(base).model, PaltConfig(prompts=(1, 0, 1))).eval()
    torch.manual_seed(0)
    x = dict(input_ids=torch.randint(5, 30, (4, 9)), token_type_ids=torch.zeros(4, 9, dtype=torch.long),
             attention_mask=torch.ones(4, 9, dtype=torch.long), prompt_index=torch.full((4, 9), -1))
    with torch.no_grad():
        plain = model(**x)
        with torch.autocast("cpu", dtype=torch.bfloat16), autocast("fp32", "cpu"):
            assert torch.equal(model(**x), plain)  # autocast("fp32") switches an outer autocast off
        with autocast("bf16", "cpu"):
            low = model(**x)
    assert low.dtype == torch.float32  # the NSP head stays fp32: no manufactured ties in the scores
    assert not torch.equal(low, plain) and torch.allclose(low, plain, atol=0.1)


def test_an_epoch_is_a_permutation_of_whole_steps_bucketed_by_length():
    rng = np.random.default_rng(0)
    keys = rng.integers(5, 60, size=1003)
    for epoch in range(3):
        order = train.epoch_order(keys, 8, epoch, seed=42, pool_steps=10)
        assert order.shape == (1003 // 8, 8)
        assert len(np.unique(order)) == order.size and order.min() >= 0 and order.max() < 1003  # no repeats
        plain = train.epoch_order(keys, 8, epoch, seed=42, pool_steps=0)
        assert set(order.ravel()) == set(plain.ravel())  # the same positives as a plain shuffle leaves out none
        spread = lambda o: (keys[o].max(1) - keys[o].min(1)).mean()
        assert spread(order) < spread(plain) / 3  # steps of similar lengths: little padding
        assert np.array_equal(order, train.epoch_order(keys, 8, epoch, seed=42, pool_steps=10))  # replays
    assert not np.array_equal(train.epoch_order(keys, 8, 0, 42), train.epoch_order(keys, 8, 1, 42))  # reshuffled
    # every step's pool-sorted positives still arrive in a shuffled order of steps, not shortest first
    lengths = keys[train.epoch_order(keys, 8, 0, 42, pool_steps=10)].mean(1)
    assert not np.all(np.diff(lengths) >= 0)


def test_two_ranks_split_every_step_and_together_see_the_whole_step():
    keys = np.random.default_rng(1).integers(5, 60, size=200)
    order = train.epoch_order(keys, 8, 0, seed=3)
    ranks = [order[:, r::2] for r in range(2)]  # what train.py gives rank r of 2
    assert all(r.shape == (25, 4) for r in ranks)
    for step in range(len(order)):
        assert sorted(np.concatenate([r[step] for r in ranks])) == sorted(order[step])
