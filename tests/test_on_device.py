"""Scores computed on an accelerator stay there until Scorer.numpy takes them off: every train.py and evaluate.py
path runs with a scorer whose tensors, like CUDA ones, refuse .numpy(). (On a GPU machine `pytest --device cuda`
runs the whole suite on the GPU itself: conftest.py.)"""
import json
import numpy as np
import pytest
import torch

import evaluate, train
from conftest import make_bert_dir, write_tiny_kg


class OnDevice(torch.Tensor):
    """A tensor that behaves as one on a GPU does where it matters here: no .numpy() (nor np.asarray); .cpu() gives a
    plain tensor."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in ("numpy", "__array__"):
            raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor "
                            "to host memory first. (OnDevice: tests/test_on_device.py)")
        out = super().__torch_function__(func, types, args, kwargs or {})
        return out.as_subclass(torch.Tensor) if name == "cpu" else out


def test_the_stand_in_refuses_numpy_as_a_cuda_tensor_does():
    t = torch.arange(3.0).as_subclass(OnDevice)
    for off in (lambda: t.numpy(), lambda: np.asarray(t), lambda: (t * 2).float().numpy()):
        with pytest.raises(TypeError, match="can't convert cuda:0"):
            off()
    assert t.cpu().numpy().tolist() == [0.0, 1.0, 2.0]


@pytest.fixture
def on_device(monkeypatch):
    """Every Scorer in this process returns OnDevice scores."""
    real = evaluate.Scorer.__call__
    monkeypatch.setattr(evaluate.Scorer, "__call__", lambda self, triples: real(self, triples).as_subclass(OnDevice))


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("on-device")
    words = write_tiny_kg(root / "data", "umls")
    write_tiny_kg(root / "data", "WN11")
    return root, make_bert_dir(root / "bert", words, layers=2)


def test_train_and_evaluate_take_scores_off_the_device_in_one_place(world, on_device, tmp_path, capsys):
    root, base = world
    common = ["--model", str(base), "--data-dir", str(root / "data"), "--prompts", "2,1,1", "--negatives", "1,1,1",
              "--batch", "6", "--lr", "3e-3", "--epochs", "1", "--dtype", "fp32"]
    # a big graph's dev signal (the stratified estimate, which once crashed on CUDA), and triple classification's
    train.main(train.parse_args(["--data", "umls", "--out", str(tmp_path / "lp"), "--dev-near", "3",
                                 "--dev-sample", "2", *common]))
    train.main(train.parse_args(["--data", "wn11", "--out", str(tmp_path / "tc"), *common]))
    out = capsys.readouterr().out
    assert "(stratified estimate" in out and "dev after epoch 1: accuracy" in out
    data = ["--data-dir", str(root / "data")]
    for argv in (["--lp", "--ckpt", tmp_path / "lp", "--out", tmp_path / "lp.json"],
                 ["--lp", "--ckpt", tmp_path / "lp", "--limit", "3", "--out", tmp_path / "lp3.json"],
                 ["--tc", "--ckpt", tmp_path / "tc", "--out", tmp_path / "tc.json"]):
        evaluate.main([str(a) for a in argv] + data)
        assert json.loads(argv[-1].read_text())["data"] in ("umls", "wn11")
    evaluate.main(["--predict", "--ckpt", str(tmp_path / "lp"), *data, "e1", "rel0"])
    assert "over 24 candidates" in capsys.readouterr().out
