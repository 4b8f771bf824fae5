"""--dtype auto: bf16 on a GPU, fp32 on a CPU without native bf16, and on one with it the faster of the two for the
model's matmuls, timed once per machine and cached; explicit choices as given. The timing is stubbed here: what is
tested is the decision and the cache, never a speed."""
import json

import pytest
import torch

from support import devices
from support.devices import resolve_dtype


@pytest.fixture
def machine(monkeypatch, tmp_path):
    """A CPU whose native bf16 and bf16 speed the test sets; the cache in tmp_path; `timings` counts the timings."""
    monkeypatch.setenv("PALT_CACHE", str(tmp_path / "cache"))
    state = {"native": True, "speedup": 1.5, "timings": 0}
    monkeypatch.setattr(devices, "cpu_has_native_bf16", lambda: state["native"])

    def bf16_speedup():
        state["timings"] += 1
        return state["speedup"]
    monkeypatch.setattr(devices, "bf16_speedup", bf16_speedup)
    return state


def test_a_cpu_without_native_bf16_gets_fp32_untimed_and_says_why(machine, capsys):
    machine["native"] = False
    assert resolve_dtype("auto", "cpu", warn=True) == "fp32"
    assert machine["timings"] == 0
    assert capsys.readouterr().err == "precision: fp32 (this CPU has no native bf16)\n"


@pytest.mark.parametrize("speedup, want", [(1.6, "bf16"), (0.62, "fp32"), (1.05, "fp32"), (1.10, "bf16")])
def test_a_cpu_with_native_bf16_gets_bf16_only_where_it_is_at_least_10_percent_faster(machine, capsys, speedup, want):
    machine["speedup"] = speedup
    assert resolve_dtype("auto", "cpu", warn=True) == want
    assert machine["timings"] == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"precision: {want} (bf16 matmuls {speedup:.2f}x fp32's speed here, timed once, cached in ")
    assert line.endswith("dtype.json)")


def test_the_verdict_is_timed_once_per_machine_and_read_from_the_cache(machine, tmp_path, monkeypatch, capsys):
    machine["speedup"] = 0.62
    assert resolve_dtype("auto", "cpu") == "fp32"
    assert capsys.readouterr().err == ""  # not the process that logs (warn=False, the Python API): quiet
    machine["speedup"] = 3.0  # a second timing would say bf16: the cache's verdict holds
    assert [resolve_dtype("auto", "cpu") for _ in range(3)] == ["fp32"] * 3 and machine["timings"] == 1
    [(key, entry)] = json.loads((tmp_path / "cache" / "dtype.json").read_text()).items()
    assert entry == {"bf16_speedup": 0.62} and f"torch {torch.__version__}" in key
    assert key.startswith(devices.cpu_info()[0]) and f"{torch.get_num_threads()} threads" in key
    monkeypatch.setattr(devices.torch, "get_num_threads", lambda: 97)  # another thread count: timed for it
    assert resolve_dtype("auto", "cpu") == "bf16" and machine["timings"] == 2
    assert len(json.loads((tmp_path / "cache" / "dtype.json").read_text())) == 2  # both kept


@pytest.mark.parametrize("damage", [b"{not json", b"[1, 2]", b'{"x": 1}', b"\xff\xfe", b""])
def test_a_damaged_cache_is_timed_again_silently_and_rewritten(machine, tmp_path, capsys, damage):
    path = tmp_path / "cache" / "dtype.json"
    path.parent.mkdir()
    path.write_bytes(damage)
    assert resolve_dtype("auto", "cpu") == "bf16" and machine["timings"] == 1
    assert capsys.readouterr().err == ""
    assert list(json.loads(path.read_text()).values()) == [{"bf16_speedup": 1.5}]
    assert not path.with_name("dtype.json.tmp").exists()


def test_a_damaged_entry_is_timed_again(machine, tmp_path):
    assert resolve_dtype("auto", "cpu") == "bf16"
    path = tmp_path / "cache" / "dtype.json"
    [key] = json.loads(path.read_text())
    for entry in ("fast", {"bf16_speedup": "1.5"}, {"bf16_speedup": -1.0}, {}):
        path.write_text(json.dumps({key: entry}))
        machine["speedup"] = 0.5
        assert resolve_dtype("auto", "cpu") == "fp32"
        machine["speedup"] = 2.0
        assert resolve_dtype("auto", "cpu") == "fp32"  # now cached
    assert machine["timings"] == 5


def test_a_cache_that_cannot_be_written_still_decides_and_says_so(machine, tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("a file, not a folder")
    monkeypatch.setenv("PALT_CACHE", str(tmp_path / "file"))  # unwritable for root too
    assert resolve_dtype("auto", "cpu", warn=True) == "bf16"
    line = capsys.readouterr().err
    assert line.startswith("precision: bf16 (bf16 matmuls 1.50x fp32's speed here, timed now: ") and "cannot be written" in line
    assert resolve_dtype("auto", "cpu") == "bf16" and machine["timings"] == 2  # nothing cached: timed again


def test_the_cache_lives_in_palt_cache_else_xdg_cache_home_else_home(monkeypatch, tmp_path):
    monkeypatch.setenv("PALT_CACHE", str(tmp_path / "p"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert devices.cache_dir() == tmp_path / "p"
    monkeypatch.delenv("PALT_CACHE")
    assert devices.cache_dir() == tmp_path / "x" / "palt"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert devices.cache_dir() == tmp_path / "home" / ".cache" / "palt"


@pytest.mark.parametrize("native", [True, False])
def test_explicit_choices_pass_through_untimed(machine, capsys, native):
    machine["native"] = native
    for device in ("cpu", "cuda"):
        assert resolve_dtype("fp32", device, warn=True) == "fp32"
        assert resolve_dtype("bf16", device) == "bf16"
    assert machine["timings"] == 0 and capsys.readouterr().err == ""
    assert resolve_dtype("bf16", "cpu", warn=True) == "bf16"
    err = capsys.readouterr().err  # asked of a CPU that emulates bf16: a warning, in one line
    assert (err.startswith("warning: this CPU has no native bf16") and len(err.splitlines()) == 1) is not native
    assert native or "emulated" in err
    with pytest.raises(ValueError):
        resolve_dtype("fp16", "cpu")


def test_a_gpu_keeps_bf16_untimed(machine, capsys):
    machine["native"] = False
    assert resolve_dtype("auto", "cuda", warn=True) == "bf16" and resolve_dtype("auto", torch.device("cuda:1")) == "bf16"
    assert machine["timings"] == 0 and capsys.readouterr().err == "precision: bf16 (GPU)\n"


def test_the_cpu_model_and_flags_are_read_from_cpuinfo(tmp_path):
    for flags, want in (("fpu avx512f avx512_bf16 sse", True), ("fpu amx_bf16", True), ("fpu avx512f avx2", False)):
        (tmp_path / "cpuinfo").write_text(f"processor\t: 0\nmodel name\t: Some CPU @ 2.0GHz\nflags\t\t: {flags}\n")
        assert devices.cpu_has_native_bf16(tmp_path / "cpuinfo") is want
        assert devices.cpu_info(tmp_path / "cpuinfo") == ("Some CPU @ 2.0GHz", frozenset(flags.split()))
    assert devices.cpu_has_native_bf16(tmp_path / "missing") is False  # no /proc (macOS, Windows): fp32
    assert devices.cpu_info(tmp_path / "missing") == ("unknown", frozenset())
    # a run's log names its machine: the first processor's model name, family and model numbers
    (tmp_path / "cpuinfo").write_text("processor\t: 0\ncpu family\t: 25\nmodel\t\t: 1\nmodel name\t: AMD EPYC\n\n"
                                      "processor\t: 1\ncpu family\t: 6\nmodel\t\t: 2\nmodel name\t: Other\n")
    threads = f"{torch.get_num_threads()} thread" + ("s" if torch.get_num_threads() > 1 else "")
    assert devices.machine("cpu", tmp_path / "cpuinfo") == f"AMD EPYC (family 25 model 1), {threads}"
    assert devices.machine("cpu", tmp_path / "missing") == f"unknown CPU (family ? model ?), {threads}"


def test_the_timing_runs_the_feed_forward_block_both_ways_and_leaves_the_seed_alone():
    before = torch.random.get_rng_state()
    speedup = devices.bf16_speedup(rows=16, hidden=8, repeats=1)  # tiny: what it returns, not how fast
    assert isinstance(speedup, float) and speedup > 0
    assert torch.equal(torch.random.get_rng_state(), before)
