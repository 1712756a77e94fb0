"""The PyTorch trainer of the experiment: protocol, metric, statistics, checkpoints."""
import dataclasses
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import stats

import analysis
from config import Config, preset
from data import BatchSampler, check_disjoint, eval_windows, load_slice
from model import Decoder
from train import evaluate, load_checkpoint, save_checkpoint, train

HERE = os.path.dirname(os.path.abspath(__file__))
MAIN = os.path.join(os.path.dirname(HERE), "main.py")


def small(kernel="continuum", **kw):
    c = dataclasses.replace(preset("smoke"), attention=kernel, **kw)
    return c.validate()


def test_shared_parameters_start_equal_and_kernel_parameters_start_at_tau():
    models = {k: Decoder(small(k, learn_temperature=True)) for k in ("continuum", "softmax", "focal")}
    for m in models.values():
        m.init_weights(3)
    ref = dict(models["continuum"].named_parameters())
    for k, m in models.items():
        for name, p in m.named_parameters():
            if name in ref and "temperature" not in name:
                assert torch.equal(p, ref[name]), (k, name)
    f = models["focal"].h[0].attn.focal
    assert torch.all(f.weight == 0) and math.isclose(f.bias.item(), 0.3, rel_tol=1e-7)
    assert math.isclose(models["softmax"].h[0].attn.log_temperature.exp().item(), 0.3, rel_tol=1e-6)
    other = Decoder(small())
    other.init_weights(4)
    assert not torch.equal(other.wte, ref["wte"])


def test_batch_order_depends_on_the_seed_only(text_file):
    data = load_slice(text_file).data
    a, b = BatchSampler(data, 32, 4, seed=1), BatchSampler(data, 32, 4, seed=1)
    for _ in range(3):
        xa, ya = a.next()
        xb, yb = b.next()
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
        assert torch.equal(xa[:, 1:], ya[:, :-1])  # targets are the next bytes
    assert not torch.equal(BatchSampler(data, 32, 4, seed=2).next()[0], xa)


@pytest.mark.parametrize("n,ctx", [(2, 4), (10, 3), (10, 9), (10, 10), (193, 192), (1000, 192)])
def test_eval_windows_cover_every_prediction_once(n, ctx):
    covered = []
    for b, L in eval_windows(n, ctx):
        assert 1 <= L <= ctx
        covered += range(b + 1, b + L + 1)  # predicted byte indices
    assert covered == list(range(1, n))


def test_evaluate_is_the_mean_nll_over_all_predictions(text_file):
    torch.manual_seed(0)
    m = Decoder(small())
    m.init_weights(0)
    data = load_slice(text_file).data[:101]  # 100 predictions: windows 32+32+32+4
    got = evaluate(m, data)
    with torch.no_grad():
        nll = []
        for b, L in eval_windows(101, 32):
            idx = data[b:b + L + 1].long()[None]
            nll.append(F.cross_entropy(m(idx[:, :-1])[0], idx[0, 1:], reduction="none"))
        want = torch.cat(nll).double().mean().item()
    assert got["bytes"] == 100
    assert abs(got["nats_per_byte"] - want) <= 1e-6 * want


def test_slices_and_errors(tmp_path, text_file):
    s = load_slice(f"{text_file}:0:0.5+{text_file}:0.5:1")
    assert torch.equal(s.data, load_slice(text_file).data)
    with pytest.raises(ValueError, match="bad range"):
        load_slice(f"{text_file}:0.6:0.5")
    with pytest.raises(ValueError, match="cannot read"):
        load_slice(str(tmp_path / "missing.txt"))
    with pytest.raises(ValueError, match="directory"):
        load_slice(str(tmp_path))
    with pytest.raises(ValueError, match="multiple of n_head"):
        small(d_model=33)
    with pytest.raises(ValueError, match="temperature"):
        small(temperature=0.0)


def test_held_out_slices_share_no_byte_with_the_training_text_or_each_other(tmp_path, text_file, cli):
    """A run refuses, before training, a selection or test slice that overlaps the
    training text, and a test slice that overlaps the selection slice, whatever path
    names the file; slices that only touch, and test slices among themselves, pass."""
    link = tmp_path / "link.txt"
    link.symlink_to(text_file)

    def run(train, select, *tests):
        argv = ["train", "--preset", "smoke", "--steps", "1", "--threads", "1", "--no-progress",
                "--train", train, "--select", select, "--out", str(tmp_path / "run")]
        for t in tests:
            argv += ["--test", t]
        return argv

    f = text_file
    for argv, want in [
        (run(f"{f}:0.2:1", f"{link}:0.1:0.25", f"{f}:0:0.1"),
         f"the selection slice '{link}:0.1:0.25' overlaps the training text '{f}:0.2:1'"),
        (run(f"{f}:0.05:0.1+{f}:0.2:1", f"{f}:0:0.05", f"{f}:0.1:0.3"),
         f"the test slice '{f}:0.1:0.3' overlaps the training text '{f}:0.05:0.1+{f}:0.2:1'"),
        (run(f"{f}:0.2:1", f"{f}:0:0.1", f"{f}:0.15:0.2", f"{f}:0.05:0.15"),
         f"the test slice '{f}:0.05:0.15' overlaps the selection slice '{f}:0:0.1'"),
        (run(str(link), f"{f}:0:0.1", f"{f}:0.1:0.2"), "overlaps the training text"),
    ]:
        assert want in cli_error(cli, *argv)
    assert not (tmp_path / "run").exists()  # refused before training
    n = load_slice(f).data.numel()
    with pytest.raises(ValueError, match=rf"bytes \[{math.floor(0.99 * n)}, {n}\) of the same file"):
        check_disjoint(load_slice(f"{f}:0.2:1"), load_slice(f"{f}:0:0.2+{link}:0.99:1"), [])
    check_disjoint(load_slice(f"{f}:0.2:1"), load_slice(f"{f}:0:0.1"),
                   [load_slice(f"{f}:0.1:0.2"), load_slice(f"{link}:0.1:0.2"), load_slice(f"{f}:0.15:0.2")])
    cli(run(f"{f}:0.2:1", f"{f}:0:0.1", f"{f}:0.1:0.2", f"{f}:0.1:0.15"))  # touching, not overlapping
    assert (tmp_path / "run" / "result.json").exists()


def test_focal_learns_its_per_token_temperature():
    m = Decoder(small("focal"))
    m.init_weights(0)
    x = torch.randint(0, 256, (2, 16))
    F.cross_entropy(m(x).reshape(-1, 256), torch.randint(0, 256, (32,))).backward()
    g = m.h[0].attn.focal
    assert g.weight.grad.abs().sum() > 0 and g.bias.grad.abs() > 0


def test_train_writes_checkpoint_and_result_and_is_reproducible(tmp_path, text_file):
    cfg = small(steps=12, eval_every=6, eval_bytes=512)
    sel, test = load_slice(f"{text_file}:0:0.1"), [load_slice(f"{text_file}:0.1:0.2")]
    tr = load_slice(f"{text_file}:0.2:1")
    r1 = train(cfg, tr, sel, test, str(tmp_path / "a"), progress=False)
    r2 = train(dataclasses.replace(cfg), tr, sel, test, str(tmp_path / "b"), progress=False)
    assert r1["eval"] == r2["eval"]  # bitwise: same seed, same thread count
    assert [p["step"] for p in r1["curve"]] == [0, 6, 12]
    on_disk = json.loads((tmp_path / "a" / "result.json").read_text())
    assert on_disk["eval"] == r1["eval"] and on_disk["config"]["attention"] == "continuum"
    assert "/" not in on_disk["train"]["text"] and on_disk["train"]["text"] == tr.label  # no machine paths
    m = load_checkpoint(str(tmp_path / "a" / "model.safetensors"))
    assert evaluate(m, test[0].data) == r1["eval"][test[0].label]
    assert not [p for p in os.listdir(tmp_path / "a") if p.startswith(".tmp")]


def test_checkpoint_format_is_what_continuum_lm_reads(tmp_path):
    from safetensors import safe_open
    m = Decoder(small("focal"))
    m.init_weights(0)
    save_checkpoint(m, str(tmp_path / "m.safetensors"))
    with safe_open(str(tmp_path / "m.safetensors"), "pt") as f:
        meta, names = f.metadata(), set(f.keys())
        assert f.get_tensor("h.0.attn.c_attn.weight").shape == (32, 96)  # [in, out]
    assert meta["format"] == "continuum-lm" and json.loads(meta["config"])["attention"] == "focal"
    assert {"wte", "wpe", "ln_f.weight", "h.1.mlp.c_proj.bias", "h.0.attn.focal.weight",
            "h.0.attn.focal.bias"} <= names
    bad = tmp_path / "bad.safetensors"
    from safetensors.torch import save_file
    save_file({"x": torch.zeros(1)}, str(bad))
    with pytest.raises(ValueError, match="not a continuum-lm checkpoint"):
        load_checkpoint(str(bad))
    from safetensors.torch import load_file
    for value in (float("nan"), float("inf")):  # was: eval printed nan nats/byte, status 0
        tensors = load_file(str(tmp_path / "m.safetensors"))
        tensors["ln_f.bias"][3] = value
        with safe_open(str(tmp_path / "m.safetensors"), "pt") as f:
            save_file(tensors, str(bad), metadata=f.metadata())
        with pytest.raises(ValueError, match=r"tensor 'ln_f.bias' has a non-finite value"):
            load_checkpoint(str(bad))


def fake_run(tmp_path, kernel, seed, nll, tau=0.3, select=None, machine="cpu A", **config):
    d = tmp_path / f"{kernel}_{tau}_{seed}_{machine}_{len(list(tmp_path.iterdir()))}"
    d.mkdir()
    cfg = preset("cpu").to_dict()
    cfg.update(attention=kernel, seed=seed, temperature=tau, **config)
    (d / "result.json").write_text(json.dumps({
        "config": cfg, "kernel": kernel, "seed": seed, "select": "sel", "tests": ["t"],
        "train": {"text": "train.txt"}, "machine": {"cpu": machine},
        "eval": {"sel": {"nats_per_byte": nll + 1 if select is None else select},
                 "t": {"nats_per_byte": nll}},
        "time": {"train_seconds": 10.0, "tokens_per_second": 100.0}, "curve": [],
        "temperatures": ([{"focal_bias": tau, "focal_weight_norm": 0.1}] if kernel == "focal" else
                         [{"tau": tau * (1 + 0.1 * seed * seed)}, {"tau": tau}])}))


def test_compare_paired_statistics(tmp_path):
    ca = [2.10, 2.12, 2.08, 2.15]
    sm = [2.13, 2.11, 2.12, 2.20]
    for s, (a, b) in enumerate(zip(ca, sm)):
        fake_run(tmp_path, "continuum", s, a)
        fake_run(tmp_path, "softmax", s, b)
    (table,) = analysis.compare(analysis.load_results([str(tmp_path)])).values()
    p = table["slices"]["t"]["paired"]["continuum - softmax"]
    d = np.array(ca) - np.array(sm)
    lo, hi = stats.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=stats.sem(d))
    assert p["mean"] == pytest.approx(d.mean(), abs=1e-12)
    assert p["ci95"] == pytest.approx([lo, hi], abs=1e-12)
    assert p["won"] == 3 and p["n"] == 4
    assert table["slices"]["t"]["kernels"]["softmax"]["sd"] == pytest.approx(np.std(sm, ddof=1))
    text = analysis.write_compare([str(tmp_path)], str(tmp_path / "cmp"))
    assert "continuum - softmax" in text and (tmp_path / "cmp.csv").exists()


def test_compare_selects_each_kernels_temperature(tmp_path):
    """softmax at two temperatures: the one with the lower mean selection NLL over the
    seeds both finished is compared with continuum on the test slice; a seed only one
    temperature finished does not take part in the choice."""
    ca = [2.10, 2.12, 2.08]
    sm = {0.3: ([2.13, 2.11, 2.12], [3.0, 3.1, 3.2]), 1.0: ([2.16, 2.09, 2.15], [2.9, 3.0, 3.1])}
    for s, x in enumerate(ca):
        fake_run(tmp_path, "continuum", s, x)
        for tau, (test, sel) in sm.items():
            fake_run(tmp_path, "softmax", s, test[s], tau=tau, select=sel[s])
    fake_run(tmp_path, "softmax", 3, 2.0, tau=0.3, select=0.0)  # would turn the choice to 0.3
    table = analysis.compare(analysis.load_results([str(tmp_path)]))
    (key, e), = analysis.select_temperatures(analysis.load_results([str(tmp_path)])).items()
    assert key.startswith(analysis.SELECTED) and "tau 0.3" not in key
    assert e["chosen"] == {"continuum": "0.3", "softmax": "1"}
    assert e["candidates"]["softmax"]["0.3"] == {"n": 3, "mean": pytest.approx(3.1)}
    assert e["candidates"]["softmax"]["1"]["mean"] == pytest.approx(3.0)
    assert list(e["slices"]) == ["t"]  # not the selection slice the choice was made on
    p = e["slices"]["t"]["paired"]["continuum - softmax"]
    assert p["mean"] == pytest.approx(np.mean(np.array(ca) - sm[1.0][0]), abs=1e-12)
    assert p["won"] == 2 and p["n"] == 3
    # the per-setting tables are unchanged: continuum against softmax at its own tau only
    (tau03,) = [v for k, v in table.items() if "tau 0.3" in k]
    assert tau03["slices"]["t"]["paired"]["continuum - softmax"]["n"] == 3
    text = analysis.write_compare([str(tmp_path)], str(tmp_path / "cmp"))
    assert "  softmax     1                3   3.0000 *" in text and "(tau 1)" in text
    assert "softmax (tau 1)" in (tmp_path / "cmp.csv").read_text()
    assert key in json.loads((tmp_path / "cmp.json").read_text())


def test_a_learned_temperature_is_a_candidate_of_its_own(tmp_path):
    """τ learned from 0.3 and τ fixed at 0.3 are two temperatures of a kernel (not two runs
    of one): the selection picks between them on the selection slice; the per-setting
    tables keep learned and fixed apart."""
    for s in range(3):
        fake_run(tmp_path, "continuum", s, 2.0 + s + 0.02 * s * s, select=3.0 + 0.01 * s)
        fake_run(tmp_path, "softmax", s, 2.2 + s, select=3.2)
        fake_run(tmp_path, "softmax", s, 2.1 + s + 0.01 * s * s, select=3.1, learn_temperature=True)
        fake_run(tmp_path, "continuum", s, 2.05 + s, select=3.05 + 0.01 * s * s, learn_temperature=True)
        fake_run(tmp_path, "focal", s, 2.3 + s * s, select=3.3, learn_temperature=True)
        for tau in (2.0, 10.0):  # fixed candidates sort by value, before the learned one
            fake_run(tmp_path, "softmax", s, 2.4 + s, tau=tau, select=3.4 + 0.01 * s * s)
    runs = analysis.load_results([str(tmp_path)])
    table = analysis.compare(runs)
    (fixed,) = [e for k, e in table.items() if "tau 0.3 (fixed)" in k]
    (learned,) = [e for k, e in table.items() if "tau 0.3 (learned)" in k]
    assert len(table) == 4 and "learned_tau_per_layer" not in fixed
    # mean over seeds (0.3 * (1, 1.1, 1.4) for layer 0), not the median; focal's τ is not a scalar
    assert learned["learned_tau_per_layer"] == {"continuum": pytest.approx([0.35, 0.3]),
                                                "softmax": pytest.approx([0.35, 0.3])}
    (e,) = analysis.select_temperatures(runs).values()
    assert list(e["candidates"]["softmax"]) == ["0.3", "2", "10", "0.3 learned"]
    assert e["chosen"] == {"continuum": "0.3", "softmax": "0.3 learned", "focal": "0.3 learned"}
    p = e["slices"]["t"]["paired"]["continuum - softmax"]
    assert p["mean"] == pytest.approx(-0.1 + 0.05 / 3, abs=1e-12) and p["n"] == 3
    text = analysis.write_compare([str(tmp_path)], str(tmp_path / "cmp"))
    assert "  softmax     0.3 learned      3   3.1000 *" in text
    assert "learned tau per layer, mean over seeds: softmax 0.350 0.300" in text
    assert "learned tau per layer, mean over seeds: focal" not in text
    assert "softmax (tau 0.3 learned)" in (tmp_path / "cmp.csv").read_text()


def test_curves_are_drawn_per_temperature_where_a_kernel_has_several():
    def run(kernel, tau, learned=False):
        return {"kernel": kernel, "curve": [{"train_bytes": 0, "select_nats_per_byte": 5.0}],
                "config": {"temperature": tau, "learn_temperature": learned}}
    runs = [run("softmax", 1.0), run("continuum", 0.3), run("softmax", 0.3), run("softmax", 0.3),
            run("softmax", 0.3, True), run("focal", 0.3), dict(run("focal", 0.3), curve=[])]
    groups = analysis.curve_groups(runs)
    assert {k: len(v) for k, v in groups.items()} == {
        "continuum": 1, "softmax, tau 0.3": 2, "softmax, tau 0.3 learned": 1, "softmax, tau 1": 1, "focal": 1}
    assert analysis.line_styles(groups) == {
        "continuum": ("C0", "-", None), "softmax, tau 0.3": ("C1", "-", None),
        "softmax, tau 0.3 learned": ("C1", "--", None), "softmax, tau 1": ("C1", ":", None),
        "focal": ("C2", "-", None)}
    many = analysis.curve_groups([run("softmax", t / 10) for t in range(1, 8)])
    looks = list(analysis.line_styles(many).values())
    assert len(set(looks)) == 7 and looks[4] == ("C1", "-", "o")  # no two lines alike
    with pytest.raises(ValueError, match="more than 24 lines of softmax"):
        analysis.line_styles(analysis.curve_groups([run("softmax", t / 100) for t in range(1, 26)]))


def test_compare_keeps_settings_apart_and_refuses_duplicates(tmp_path):
    """Runs that differ in anything but kernel, seed and thread count are other settings,
    named by what differs; two runs of one kernel and seed in a setting are an error."""
    for s in range(2):
        fake_run(tmp_path, "continuum", s, 2.0 + s, threads=s + 1)
        fake_run(tmp_path, "softmax", s, 2.1 + 1.5 * s)
        fake_run(tmp_path, "softmax", s, 2.3 + s, machine="cpu B")
        fake_run(tmp_path, "softmax", s, 2.4 + s, lr=1e-3)
    table = analysis.compare(analysis.load_results([str(tmp_path)]))
    assert sorted(k.split(" [")[-1] for k in table) == [
        "lr 0.001, machine cpu A]", "lr 0.003, machine cpu A]", "lr 0.003, machine cpu B]"]
    (same,) = [e for k, e in table.items() if "lr 0.003, machine cpu A" in k]
    assert same["slices"]["t"]["paired"]["continuum - softmax"]["n"] == 2
    assert same["slices"]["t"]["kernels"]["softmax"]["mean"] == pytest.approx(2.85)
    fake_run(tmp_path, "softmax", 1, 9.0, threads=7)
    with pytest.raises(ValueError, match="two runs of softmax, tau 0.3, seed 1 in one setting"):
        analysis.compare(analysis.load_results([str(tmp_path)]))


def test_compare_without_a_choice_has_no_selection(tmp_path):
    for s in range(2):
        fake_run(tmp_path, "continuum", s, 2.0 + s)
        fake_run(tmp_path, "softmax", s, 2.1 + 1.5 * s)
    assert analysis.select_temperatures(analysis.load_results([str(tmp_path)])) == {}
    assert analysis.SELECTED not in analysis.write_compare([str(tmp_path)], str(tmp_path / "cmp"))


def run_main(*args, env=None, **kw):
    return subprocess.run([sys.executable, MAIN, *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, **kw)


def test_sweep_resumes_and_cli_errors(tmp_path, text_file):
    common = ["--preset", "smoke", "--steps", "4", "--eval-every", "0", "--train", f"{text_file}:0.2:1",
              "--select", f"{text_file}:0:0.05", "--test", f"{text_file}:0.05:0.1"]
    r = run_main("sweep", *common, "--kernels", "continuum,softmax", "--seeds", "0", "--out",
                 str(tmp_path / "s"))
    assert r.returncode == 0, r.stderr
    assert "continuum - softmax" in r.stdout
    r = run_main("sweep", *common, "--kernels", "continuum,softmax", "--seeds", "0", "--out",
                 str(tmp_path / "s"))
    assert r.returncode == 0 and "2 already finished, 0 to go" in r.stdout
    r = run_main("train", *common, "--temperature", "-1", "--out", str(tmp_path / "x"))
    assert r.returncode != 0 and "temperature must be finite and > 0" in r.stderr
    assert not (tmp_path / "x").exists()


def test_ddp_two_processes_match_one(tmp_path, text_file):
    """torchrun --nproc-per-node 2 (gloo): the global batch split over two
    ranks gives the same model as one process, up to the order of the
    gradient sum (float32 rounding over a few steps). The key part of
    c_attn.bias is left out: adding one vector to every key shifts each score
    row by a constant, so its exact gradient is 0 and AdamW turns the rounding
    noise it gets into lr-sized steps of either sign."""
    common = ["train", "--preset", "smoke", "--steps", "5", "--eval-every", "0", "--threads", "1",
              "--train", f"{text_file}:0.2:1", "--select", f"{text_file}:0:0.02",
              "--test", f"{text_file}:0.02:0.04", "--no-progress"]
    r1 = run_main(*common, "--out", str(tmp_path / "one"))
    assert r1.returncode == 0, r1.stderr
    r2 = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                         "--nproc-per-node", "2", MAIN, *common, "--out", str(tmp_path / "two")],
                        capture_output=True, text=True)
    assert r2.returncode == 0, r2.stderr[-3000:]
    a = load_checkpoint(str(tmp_path / "one" / "model.safetensors")).state_dict()
    b = load_checkpoint(str(tmp_path / "two" / "model.safetensors")).state_dict()
    C = a["wte"].shape[1]
    for k in a:
        x, y = a[k], b[k]
        if k.endswith("c_attn.bias"):
            x, y = torch.cat([x[:C], x[2 * C:]]), torch.cat([y[:C], y[2 * C:]])
        assert (x - y).abs().max().item() <= 1e-4 * x.abs().max().item(), k
    e1 = json.loads((tmp_path / "one" / "result.json").read_text())["eval"]
    e2 = json.loads((tmp_path / "two" / "result.json").read_text())["eval"]
    for sl in e1:
        assert abs(e1[sl]["nats_per_byte"] - e2[sl]["nats_per_byte"]) <= 1e-5 * e1[sl]["nats_per_byte"]
    assert json.loads((tmp_path / "two" / "result.json").read_text())["time"]["processes"] == 2


# The command line in this process (main.main(argv)): each command's errors end in
# SystemExit("PROG CMD: error: ...") (one line), argparse's in SystemExit(2).

@pytest.fixture
def cli():
    import main
    threads = torch.get_num_threads()  # eval and train set it for the process
    yield main.main
    torch.set_num_threads(threads)


@pytest.fixture
def checkpoint(tmp_path):
    m = Decoder(small())
    m.init_weights(0)
    path = str(tmp_path / "model.safetensors")
    save_checkpoint(m, path)
    return path


def cli_error(cli, *argv):
    with pytest.raises(SystemExit) as e:
        cli(list(argv))
    assert isinstance(e.value.code, str) and "\n" not in e.value.code, e.value.code
    assert f" {argv[0]}: error: " in e.value.code
    return e.value.code


def test_write_atomic_follows_symlinks_and_replaces_only_regular_files(tmp_path):
    from train import write_atomic, write_json
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    folder = tmp_path / "folder"
    folder.mkdir()
    for target in (fifo, folder):
        with pytest.raises(ValueError, match=f"{target}.*not a regular file"):
            write_atomic(str(target), b"x")
    assert fifo.is_fifo() and folder.is_dir()  # untouched
    real, link = tmp_path / "real.json", tmp_path / "link.json"
    real.write_text("old")
    link.symlink_to(real.name)  # relative, resolved beside the link
    write_json(str(link), {"a": 1})
    assert link.is_symlink() and json.loads(real.read_text()) == {"a": 1}
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "new.txt")
    write_atomic(str(dangling), b"new")
    assert dangling.is_symlink() and (tmp_path / "new.txt").read_bytes() == b"new"
    to_fifo = tmp_path / "to-fifo"
    to_fifo.symlink_to(fifo)
    with pytest.raises(ValueError, match=f"{fifo}.*not a regular file"):
        write_atomic(str(to_fifo), b"x")
    assert fifo.is_fifo() and to_fifo.is_symlink()
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".tmp")]


def test_write_atomic_gives_the_mode_open_would(tmp_path):
    from train import write_atomic
    old = os.umask(0o027)
    try:
        write_atomic(str(tmp_path / "new.json"), b"{}")
        m = Decoder(small())
        save_checkpoint(m, str(tmp_path / "m.safetensors"))
        (tmp_path / "kept.json").write_text("old")
        os.chmod(tmp_path / "kept.json", 0o604)
        write_atomic(str(tmp_path / "kept.json"), b"new")
    finally:
        os.umask(old)
    assert (tmp_path / "new.json").stat().st_mode & 0o777 == 0o640
    assert (tmp_path / "m.safetensors").stat().st_mode & 0o777 == 0o640
    assert (tmp_path / "kept.json").stat().st_mode & 0o777 == 0o604  # open() keeps an existing file's mode
    assert (tmp_path / "kept.json").read_bytes() == b"new"


def test_fewer_than_two_bytes_is_an_error_wherever_evaluate_is_used(tmp_path, text_file, checkpoint, cli):
    m = load_checkpoint(checkpoint)
    data = load_slice(text_file).data
    assert evaluate(m, data[:2])["bytes"] == 1
    for n in (1, 0):  # was 0.0 nats/byte over 0 bytes
        with pytest.raises(ValueError, match=r"has fewer than 2 bytes \(nothing to score\)"):
            evaluate(m, data[:n])
    with pytest.raises(ValueError, match=r"^data: slice 'x' has fewer than 2 bytes"):
        evaluate(m, data[:1], spec="x")
    with pytest.raises(ValueError, match="fewer than 2 bytes"):
        evaluate(m, data, max_bytes=1)
    one = tmp_path / "one.txt"
    one.write_bytes(b"a")
    for spec in (str(one), f"{text_file}:0:0.00003"):  # 1 byte of the 48 kB text
        msg = cli_error(cli, "eval", "--checkpoint", checkpoint, "--valid", spec, "--threads", "1")
        assert f"slice {spec!r} has fewer than 2 bytes (nothing to score)" in msg
    train = ["train", "--preset", "smoke", "--steps", "1", "--threads", "1", "--no-progress",
             "--train", f"{text_file}:0.2:1", "--select", f"{text_file}:0:0.01",
             "--test", f"{text_file}:0.01:0.02", "--out", str(tmp_path / "run")]
    msg = cli_error(cli, *train, "--test", str(one))
    assert f"slice {str(one)!r} has fewer than 2 bytes" in msg
    msg = cli_error(cli, *train[:-4], "--select", str(one), *train[-4:])
    assert f"slice {str(one)!r} has fewer than 2 bytes" in msg
    msg = cli_error(cli, *train, "--eval-bytes", "1")
    assert "cut to its first 1 bytes (eval_bytes) has fewer than 2 bytes" in msg
    assert not (tmp_path / "run").exists()  # refused before training


def test_train_zero_steps_prints_the_summary(tmp_path, text_file, cli, capsys):
    out = tmp_path / "run"
    cli(["train", "--preset", "smoke", "--steps", "0", "--threads", "1", "--no-progress",
         "--train", f"{text_file}:0.2:1", "--select", f"{text_file}:0:0.005", "--test", f"{text_file}:0.005:0.01",
         "--out", str(out)])
    assert "no training steps" in capsys.readouterr().out
    assert json.loads((out / "result.json").read_text())["time"]["tokens_per_second"] is None


@pytest.mark.parametrize("argv", [
    ["sweep", "--kernel", "softmax"],  # would be --kernels, but not stripped from the runs' options
    ["train", "--step", "3"],
    ["eval", "--checkpoint", "x", "--val", "y"],
])
def test_abbreviated_options_are_usage_errors(tmp_path, cli, capsys, argv):
    with pytest.raises(SystemExit) as e:
        cli([*argv, "--out", str(tmp_path / "out")] if argv[0] != "eval" else argv)
    assert e.value.code == 2
    assert f"unrecognized arguments: {argv[-2]}" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_generate_sample_temperature_is_finite_and_not_negative(checkpoint, cli, capsys):
    for bad in ("-1", "-0.5", "nan", "inf", "hot"):
        with pytest.raises(SystemExit) as e:
            cli(["generate", "--checkpoint", checkpoint, "--sample-temperature", bad])
        assert e.value.code == 2
        assert "argument --sample-temperature:" in capsys.readouterr().err
    cli(["generate", "--checkpoint", checkpoint, "--bytes", "4", "--prompt", "Once", "--sample-temperature", "0"])
    greedy = capsys.readouterr().out
    cli(["generate", "--checkpoint", checkpoint, "--bytes", "4", "--prompt", "Once", "--sample-temperature", "0"])
    assert capsys.readouterr().out == greedy and greedy.startswith("Once") and len(greedy.encode()) >= 9


def test_corrupt_or_incomplete_checkpoint_is_a_one_line_error(tmp_path, checkpoint, cli):
    from safetensors.torch import load_file, save_file
    from safetensors import safe_open
    raw = open(checkpoint, "rb").read()
    with safe_open(checkpoint, "pt") as f:
        meta = f.metadata()
    tensors = load_file(checkpoint)
    cases = {}
    for name, n in (("half", len(raw) // 2), ("header", 100), ("empty", 0)):
        cases[name] = tmp_path / f"{name}.safetensors"
        cases[name].write_bytes(raw[:n])
    cases["missing"] = tmp_path / "missing.safetensors"
    save_file({k: v for k, v in tensors.items() if k != "wpe"}, str(cases["missing"]), metadata=meta)
    cases["shape"] = tmp_path / "shape.safetensors"
    save_file({**tensors, "wpe": tensors["wpe"][:-1].contiguous()}, str(cases["shape"]), metadata=meta)
    cases["extra"] = tmp_path / "extra.safetensors"
    save_file({**tensors, "bogus": torch.zeros(1)}, str(cases["extra"]), metadata=meta)
    cases["config"] = tmp_path / "config.safetensors"
    save_file(tensors, str(cases["config"]), metadata={**meta, "config": "{not json"})
    cases["absent"] = tmp_path / "absent.safetensors"
    cases["folder"] = tmp_path
    for name, path in cases.items():
        with pytest.raises(ValueError, match="^" + str(path).replace("\\", "\\\\") + ": ") as e:
            load_checkpoint(str(path))
        assert "\n" not in str(e.value), (name, str(e.value))
    assert "missing tensors wpe" in str(pytest.raises(ValueError, load_checkpoint, str(cases["missing"])).value)
    for cmd in (["eval", "--valid", checkpoint], ["generate"]):
        for path in (cases["half"], cases["missing"]):
            msg = cli_error(cli, cmd[0], "--checkpoint", str(path), *cmd[1:])
            assert f"error: {path}: " in msg


def test_cpu_512_preset_keeps_the_cpu_budget():
    """cpu-512 changes the context only: the same bytes per step and per run, the
    same model and schedule, so its sweep is comparable with cpu's."""
    a, b = preset("cpu"), preset("cpu-512").validate()
    assert b.context == 512 and b.batch_size * b.context == a.batch_size * a.context
    assert b.tokens_budget == a.tokens_budget
    same = {k: v for k, v in a.to_dict().items() if k not in ("preset", "context", "batch_size")}
    assert same == {k: v for k, v in b.to_dict().items() if k in same}
