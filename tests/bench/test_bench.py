"""The ground-truth benchmark: build (every network, every seed, every budget; resumable;
timed), the query API, the CLI, and that `fbnas retrain` reproduces an entry."""

from __future__ import annotations

import json
import math
import subprocess

import pytest
import torch
from conftest import digits_run_config, needs, one_line_error

import fbnas.bench.build as bench_build
from fbnas import __version__
from fbnas._cli import main
from fbnas.arch import Architecture
from fbnas.bench.build import all_archs, build_bench
from fbnas.bench.table import Bench, bench_for, same_training, training_record
from fbnas.config import config_from_dict
from fbnas.errors import FbnasError
from fbnas.runs.provenance import PACKAGE, source_hash

# 2 searchable layers x 2 ops: 4 networks
SPACE = {
    "name": "bench_tiny", "input_size": 8, "in_channels": 1, "num_classes": 10,
    "stem": {"channels": 8, "stride": 1},
    "candidates": ["ir_k3_e1", "ir_k3_e3"],
    "stages": [{"channels": 8, "repeats": 1, "stride": 1},
               {"channels": 16, "repeats": 1, "stride": 2}],
    "head": {"channels": 16},
}


# the same shape at 16x16 with wider layers: large enough that one and two threads sum the
# floats in other orders (at 8x8 they happen to agree), so a build at another thread count
# than `fbnas retrain` would show
SPACE16 = {
    "name": "bench_tiny16", "input_size": 16, "in_channels": 1, "num_classes": 10,
    "stem": {"channels": 8, "stride": 1},
    "candidates": ["ir_k3_e1", "ir_k3_e6"],
    "stages": [{"channels": 16, "repeats": 1, "stride": 1},
               {"channels": 24, "repeats": 1, "stride": 2}],
    "head": {"channels": 32},
}


def _cfg(tmp_path, **retrain):
    d = digits_run_config(
        retrain={"epochs": 2, "lr": 0.05, "warmup_epochs": 0, "threads": 1, **retrain},
        space=SPACE,
        data={"limit": 120},
        latency={"cost": "latency", "device": "fake", "cache_dir": str(tmp_path / "cache")})
    d["run"]["dir"] = str(tmp_path / "run")
    return d


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    cfg = config_from_dict(_cfg(tmp), "bench.yaml")
    out = tmp / "b.json.gz"
    lines = []
    build_bench(cfg, out, seeds=(0, 1), rounds=3, log=lines.append)
    return tmp, cfg, out, lines


def test_every_network_is_trained_at_every_budget_and_timed(built):
    _, cfg, out, lines = built
    b = Bench.load(out)
    assert len(b) == len(all_archs(cfg.space)) == 4 and all(b.complete(k) for k in b)
    assert b.budgets == [1, 2] and b.seeds == [0, 1]
    for k in b:
        n = b.networks[k]
        assert n["predicted"] > 0 and n["measured"] > 0 and n["params"] > 0
        for s in ("0", "1"):
            one, two = n["runs"][s]["1"], n["runs"][s]["2"]
            assert 0 <= one["test_acc"] <= 1 and 0 <= two["val_acc"] <= 1
            assert two["seconds"] > one["seconds"] > 0  # cumulative training time
    assert sum(ln.startswith("[") for ln in lines) == 4  # one progress line per network
    meta = b.meta
    assert meta["space_hash"] and meta["training"]["retrain"]["epochs"] == 2
    assert meta["versions"]["torch"] and meta["machine"]["platform"]


def test_query_counts_the_budget_and_records_do_not(built):
    _, cfg, out, _ = built
    b = Bench.load(out)
    a = all_archs(cfg.space)[3]
    rec = b.query(a, budget=1, seed=1)
    assert rec["seed"] == 1 and rec["budget"] == 1 and rec["ops"] == list(a.ops)
    assert b.spent_epochs == 1 and b.spent_seconds == pytest.approx(rec["seconds"])
    assert len(b.records(a)) == 4 and b.spent_epochs == 1
    assert b.query(a)["budget"] == 2 and b.spent_epochs == 3  # default: the full budget
    means = {k: b.mean(k) for k in b}
    front = b.front()
    lats = [b.latency(k) for k in front]
    assert lats == sorted(lats) and [means[k] for k in front] == sorted(means[k] for k in front)
    assert max(means, key=means.get) in front
    with pytest.raises(FbnasError, match="budget 5: the benchmark records 1, 2"):
        b.query(a, budget=5)


def test_an_architecture_outside_the_space_is_one_line_naming_layer_and_op(built, tmp_path,
                                                                           capsys):
    _, cfg, out, _ = built
    a = all_archs(cfg.space)[0]
    bad = Architecture(a.macro, [a.ops[0], "ir_k5_e6"], "bad", a.space)
    path = tmp_path / "bad.yaml"
    bad.save(path)
    assert main(["bench", "query", str(path), "--bench", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "layer 1 op 'ir_k5_e6'" in err and str(path) in err


def test_cli_query_and_show(built, tmp_path, capsys):
    _, cfg, out, _ = built
    b = Bench.load(out)
    best = max(b, key=b.mean)
    path = tmp_path / "best.yaml"
    b.arch(best).save(path)
    assert main(["bench", "query", str(path), "--bench", str(out)]) == 0
    said = capsys.readouterr().out
    assert "seed 1 budget   2" in said and "rank 1 of 4" in said
    assert main(["bench", "show", "--bench", str(out)]) == 0
    said = capsys.readouterr().out
    assert "4 networks, 4 complete" in said and "spread / seed sd" in said
    assert f"seed 0 vs seed 1 {b.seed_tau('val_acc', 2):.3f}" in said


def test_seed_tau_is_the_rank_agreement_of_the_first_two_seeds(built):
    from scipy.stats import kendalltau
    b = Bench.load(built[2])
    keys = [k for k in b if b.complete(k)]
    per = {s: [next(r["val_ce"] for r in b.records(k) if r["seed"] == s and r["budget"] == 2)
               for k in keys] for s in b.seeds[:2]}
    want = kendalltau(per[b.seeds[0]], per[b.seeds[1]]).statistic
    assert b.seed_tau("val_ce", 2) == pytest.approx(want)
    assert -1.0 <= b.seed_tau() <= 1.0


def test_a_build_needs_retrain_threads(tmp_path):
    d = _cfg(tmp_path)
    del d["retrain"]["threads"]
    cfg = config_from_dict(d, "nothreads.yaml")
    out = tmp_path / "b.json.gz"
    one_line_error(lambda: build_bench(cfg, out, seeds=(0,), rounds=3, log=lambda s: None),
                   "nothreads.yaml: retrain.threads is not set", "fbnas retrain --config")
    assert not out.exists()


def test_the_file_records_the_code_it_was_built_at(built, capsys):
    _, _, out, _ = built
    b = Bench.load(out)
    (code,) = b.code  # one sitting
    assert code["source_hash"] == source_hash() and code["fbnas"] == __version__
    head = subprocess.run(["git", "-C", str(PACKAGE.parent), "rev-parse", "HEAD"],
                          capture_output=True, text=True)
    checkout = head.returncode == 0 and subprocess.run(
        ["git", "-C", str(PACKAGE.parent), "rev-parse", "--show-toplevel"], capture_output=True,
        text=True).stdout.strip() == str(PACKAGE.parent)
    assert code["commit"] == (head.stdout.strip() if checkout else None)
    assert isinstance(code["dirty"], bool) or not checkout
    assert b.meta["machine"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert b.meta["training"]["retrain"]["threads"] == 1
    assert main(["bench", "show", "--bench", str(out)]) == 0
    said = capsys.readouterr().out
    assert ("built at commit " + code["commit"][:12] if checkout else "built at fbnas") in said
    assert "retrain.threads 1" in said


def test_a_file_from_before_loads_and_serves_the_config_that_now_sets_threads(built,
                                                                                tmp_path,
                                                                                capsys):
    """A file written before the code and retrain.threads were recorded (the shipped ones of
    issue 39) loads, is read by a sweep, is shown; a build refuses to resume it."""
    _, cfg, out, _ = built
    old = Bench.load(out)
    del old.meta["code"], old.meta["training"]["retrain"]["threads"]
    path = old.save(tmp_path / "old.json.gz")
    b = bench_for(path, cfg)
    assert b.code == [] and len(b) == 4
    assert main(["bench", "show", "--bench", str(path)]) == 0
    assert "built at an unrecorded commit" in capsys.readouterr().out
    with pytest.raises(FbnasError, match="another training than bench.yaml gives"):
        build_bench(cfg, path, seeds=(0, 1), rounds=3, log=lambda s: None)
    now = training_record(cfg)
    two = {**now, "retrain": {**now["retrain"], "threads": 2}}
    assert same_training(old.meta["training"], now) and not same_training(two, now)
    assert not same_training({**now, "retrain": {**now["retrain"], "extra": 1}}, now)


def test_a_sitting_on_other_code_is_recorded_beside_the_first(tmp_path, monkeypatch):
    cfg = config_from_dict(_cfg(tmp_path, epochs=1), "bench.yaml")
    out, lines = tmp_path / "b.json.gz", []
    build_bench(cfg, out, seeds=(0,), rounds=3, limit=1, log=lines.append)
    first = Bench.load(out).code
    assert first[0]["machine"] == bench_build.machine()
    other = {**first[0], "commit": "f" * 40, "source_hash": "e" * 64}
    del other["machine"]
    monkeypatch.setattr(bench_build, "code_record", lambda: dict(other))
    build_bench(cfg, out, seeds=(0,), rounds=3, limit=1, log=lines.append)
    assert Bench.load(out).code == [first[0], {**other, "machine": bench_build.machine()}]
    assert any(ln.startswith("bench: ") and "resuming with commit ffffffffffff" in ln
               for ln in lines)
    build_bench(cfg, out, seeds=(0,), rounds=3, limit=1, log=lines.append)  # the same again
    assert len(Bench.load(out).code) == 2


def test_a_host_is_held_to_a_lower_cpu_capability_only():
    env = bench_build.capability_env
    assert env("AVX2", "AVX2") == {} and env("AVX512", "AVX512") == {}
    assert env("AVX2", "AVX512") == {"ATEN_CPU_CAPABILITY": "avx2",
                                      "ONEDNN_MAX_CPU_ISA": "AVX2"}
    assert env("AVX512", "AVX2") is None  # a lower host cannot train as a higher one
    assert env("AVX2", "ZVECTOR") is None and env(None, "AVX2") is None


def test_a_sitting_on_another_cpu_capability_says_how_to_train_as_the_first(tmp_path,
                                                                           monkeypatch):
    cfg = config_from_dict(_cfg(tmp_path, epochs=1), "bench.yaml")
    out, lines, host = tmp_path / "b.json.gz", [], bench_build.machine()
    monkeypatch.setattr(bench_build, "machine", lambda: {**host, "cpu_capability": "AVX2"})
    build_bench(cfg, out, seeds=(0,), rounds=3, limit=1, log=lines.append)
    monkeypatch.setattr(bench_build, "machine", lambda: {**host, "cpu_capability": "AVX512"})
    monkeypatch.setattr(bench_build.torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    build_bench(cfg, out, seeds=(0,), rounds=3, limit=1, log=lines.append)
    said = [ln for ln in lines if ln.startswith("bench: ") and "resuming" in ln]
    assert len(said) == 1 and said[0].endswith(
        "trained by AVX2 kernels, these are AVX512: to train as they did, resume with "
        "ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2")


def test_a_worker_importing_other_fbnas_sources_refuses_in_one_line(built):
    _, cfg, _, _ = built
    a = all_archs(cfg.space)[0]
    code = {"source_hash": "0" * 64, "package": "/elsewhere/fbnas"}
    one_line_error(lambda: bench_build.train_seeds(cfg, a, [0], [2], "/nonexistent", code),
                   f"network {a.short_hash}", str(PACKAGE), "/elsewhere/fbnas", "PYTHONPATH")


@pytest.mark.slow
def test_a_killed_build_resumes_keeping_the_networks_done(tmp_path, monkeypatch):
    cfg = config_from_dict(_cfg(tmp_path, epochs=1), "bench.yaml")
    out = tmp_path / "b.json.gz"
    build_bench(cfg, out, seeds=(0,), rounds=3, limit=2, log=lambda s: None)
    first = Bench.load(out)
    assert sum(first.complete(k) for k in first) == 2
    trained = []
    real = bench_build.train_one
    monkeypatch.setattr(bench_build, "train_one",
                        lambda c, a, s, bud, w: trained.append(a.hash()) or real(c, a, s, bud, w))
    build_bench(cfg, out, seeds=(0,), rounds=3, log=lambda s: None)
    again = Bench.load(out)
    assert all(again.complete(k) for k in again) and len(again) == 4
    assert len(trained) == 2 and not set(trained) & {k for k in first if first.complete(k)}
    for k in first:  # the networks done before are kept as they were
        assert again.networks[k]["runs"] == first.networks[k]["runs"]
    other = config_from_dict(_cfg(tmp_path, epochs=1, lr=0.1), "other.yaml")
    with pytest.raises(FbnasError, match="another training than other.yaml gives"):
        build_bench(other, out, seeds=(0,), rounds=3, log=lambda s: None)


@pytest.mark.slow
def test_fbnas_retrain_reproduces_an_entry(built, tmp_path):
    """The entry at the full budget is `fbnas retrain`'s result for that seed, exactly: the
    test evaluations at the smaller budgets leave the random number generators alone."""
    tmp, cfg, out, _ = built
    b = Bench.load(out)
    k = sorted(b)[1]
    arch = tmp_path / "a.yaml"
    b.arch(k).save(arch)
    conf = tmp_path / "c.yaml"
    d = _cfg(tmp)
    conf.write_text(json.dumps(d))
    assert main(["retrain", "--arch", str(arch), "--config", str(conf), "--out",
                 str(tmp_path / "r"), "--set", "retrain.seed=1",
                 "--set", "retrain.measure_latency=false"]) == 0
    res = json.loads((tmp_path / "r" / "results.json").read_text())
    assert res["top1"] == b.networks[k]["runs"]["1"]["2"]["test_acc"]
    assert res["test_ce"] == pytest.approx(b.networks[k]["runs"]["1"]["2"]["test_ce"],
                                           rel=1e-6)


@pytest.fixture(scope="module")
def searched(built):
    """A 2-epoch search on the benchmark's space (the fake device's table)."""
    tmp, cfg, out, _ = built
    d = _cfg(tmp)
    d["search"].update({"epochs": 2, "warmup_epochs": 1})
    d["loss"] = {"kind": "target", "target": "0.5x", "lambda": 1.0}
    d["run"]["dir"] = str(tmp / "search")
    conf = tmp / "search.yaml"
    conf.write_text(json.dumps(d))
    assert main(["train", "--config", str(conf)]) == 0
    return tmp / "search"


def _truth_by_hand(b: Bench):
    t = {}
    for k in b:
        accs = [b.networks[k]["runs"][str(s)]["2"]["test_acc"] for s in b.seeds]
        t[k] = (b.networks[k]["measured"], sum(accs) / len(accs))
    return t


def test_score_reads_regret_and_percentile_off_the_truth(built, searched, tmp_path, capsys):
    from fbnas.bench.score import score_run
    _, cfg, out, _ = built
    b = Bench.load(out)
    t = _truth_by_hand(b)
    s = score_run(b, searched, near=10.0, trials=20)  # near=10: every network is matched
    k = Architecture.load(searched / "arch_hard.yaml").hash()
    lat, acc = t[k]
    assert s.true_acc == pytest.approx(acc) and s.latency == lat
    assert s.regret == pytest.approx(max(a for la, a in t.values() if la <= lat) - acc)
    assert s.matched == 4 and s.percentile == pytest.approx(
        100 * sum(a <= acc for _, a in t.values()) / 4)
    assert -1 <= s.kendall_tau <= 1 and -1 <= s.spearman_rho <= 1
    assert s.search_seconds > 0 and s.random_search_networks >= 1
    assert s.random_regret >= 0 and s.random_search_regret >= 0
    others = [a for j, (_, a) in t.items() if j != k]
    assert s.beats_random == pytest.approx(sum(
        1.0 if a < acc else 0.5 if a == acc else 0.0 for a in others) / len(others))
    assert -1 <= s.yardstick_tau <= 1 and -1 <= s.tau_seed <= 1
    # what the run's target allows: the networks measured within ±3% of it, else the nearest's
    # distance plus 3%; the best of them by regret
    target = s.target
    lats = {j: la for j, (la, _) in t.items()}
    allowed = [j for j, la in lats.items() if abs(la / target - 1) <= 0.03] or [
        j for j, la in lats.items() if abs(math.log(la / target)) <= min(
            abs(math.log(x / target)) for x in lats.values()) + math.log(1.03) + 1e-9]
    assert s.on_target == len(allowed) >= 1
    assert s.on_target_regret == pytest.approx(min(
        max(a for la, a in t.values() if la <= lats[j]) - t[j][1] for j in allowed))
    # the percentile's ceiling on the target, and every allowed network trained once per seed
    def reg(j):
        return max(a for la, a in t.values() if la <= lats[j]) - t[j][1]
    def pct(j):
        return 100 * sum(a <= t[j][1] for _, a in t.values()) / 4
    assert s.on_target_percentile == pytest.approx(max(pct(j) for j in allowed))
    val = {sd: max(allowed, key=lambda j: (b.networks[j]["runs"][str(sd)]["2"]["val_acc"],
                                           -b.networks[j]["runs"][str(sd)]["2"]["val_ce"]))
           for sd in b.seeds}
    assert s.exhaustive_regret == pytest.approx(sum(map(reg, val.values())) / len(val))
    assert s.exhaustive_percentile == pytest.approx(sum(map(pct, val.values())) / len(val))
    assert s.exhaustive_top10 == pytest.approx(
        sum(pct(j) >= 90 for j in val.values()) / len(val))
    # the best network of the space has no regret and tops its latency band
    best = max(t, key=lambda j: t[j][1])
    b.arch(best).save(searched / "arch_hard.yaml")
    s = score_run(b, searched, near=10.0, trials=5, rank=False)
    assert s.regret == 0 and s.percentile == 100 and math.isnan(s.kendall_tau)
    assert main(["bench", "score", str(searched), "--bench", str(out), "--no-rank",
                 "--trials", "5", "--json", str(tmp_path / "s.json")]) == 0
    assert "regret 0.00 pt, percentile 100" in capsys.readouterr().out
    assert json.loads((tmp_path / "s.json").read_text())[0]["regret"] == 0


def test_on_target_is_the_band_else_the_fits_rule_in_a_gap():
    from fbnas.bench.score import on_target
    t = {k: {"latency": la, "acc": 0.9} for k, la in
         {"a": 90.0, "b": 96.0, "c": 98.5, "d": 104.0, "e": 110.0}.items()}
    assert sorted(on_target(t, 100.0, 0.03)) == ["c"]
    assert sorted(on_target(t, 100.0, 0.05)) == ["b", "c", "d"]
    # nothing within ±3% of 86: the nearest is 90 (+4.7%), so up to 90 × 1.03 counts
    assert sorted(on_target(t, 86.0, 0.03)) == ["a"]
    t["f"] = {"latency": 92.5, "acc": 0.9}
    assert sorted(on_target(t, 86.0, 0.03)) == ["a", "f"]


@pytest.mark.slow
def test_fidelity_reads_the_benchmark_instead_of_retraining(built, searched, tmp_path):
    _, _, out, _ = built
    b = Bench.load(out)
    assert main(["fidelity", str(searched), "--bench", str(out), "--out",
                 str(tmp_path / "f")]) == 0
    rep = json.loads((tmp_path / "f" / "fidelity.json").read_text())
    assert rep["n"] == 4 and rep["retrain_seeds"] == 2  # every network, both seeds
    for p in rep["points"]:
        assert p["standalone_val_top1"] == pytest.approx(b.mean(p["hash"], "val_acc"))
    assert not list((tmp_path / "f").glob("retrain-*"))  # nothing was retrained


@pytest.mark.slow
def test_a_build_on_ray_workers_records_what_the_serial_build_does(built, tmp_path):
    needs("ray", "ray")
    _, cfg, out, _ = built
    serial = Bench.load(out)
    par_out = tmp_path / "ray.json.gz"
    lines = []
    b = build_bench(cfg, par_out, seeds=(0, 1), rounds=3, workers=2, log=lines.append)
    assert len(b) == 4 and all(b.complete(k) for k in b)
    assert sum(ln.startswith("[") for ln in lines) == 4  # a line per network as it finishes

    def figures(bench, k):  # the training seconds differ; every figure trained does not
        return {s: {bud: {m: v for m, v in r.items() if m != "seconds"}
                    for bud, r in runs.items()} for s, runs in bench.networks[k]["runs"].items()}
    for k in serial:
        assert figures(b, k) == figures(serial, k)


@pytest.mark.slow
def test_a_ray_build_records_what_fbnas_retrain_gives(tmp_path):
    needs("ray", "ray")
    """Issue 51: the Ray build (`--workers 2`, each task checking that its worker imports
    this fbnas) records, to the last digit, what `fbnas retrain --config` of that network
    under that seed reads: the config's retrain.threads (1) holds in both, though this process
    runs 2 (a retrain at 2 threads reads other last digits on this space)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        _ray_build_equals_retrain(tmp_path)
    finally:
        torch.set_num_threads(saved)


def _ray_build_equals_retrain(tmp_path):
    d = _cfg(tmp_path)
    d["space"], d["data"]["limit"] = SPACE16, 400
    conf = tmp_path / "c.yaml"
    conf.write_text(json.dumps(d))
    out = tmp_path / "ray.json.gz"
    assert main(["bench", "build", "--config", str(conf), "--bench", str(out), "--workers", "2",
                 "--rounds", "3"]) == 0
    b = Bench.load(out)
    assert len(b) == 4 and all(b.complete(k) for k in b) and b.code[0]["source_hash"]
    for k, seed in zip(sorted(b)[:2], (1, 0), strict=True):
        arch, run = tmp_path / f"{k[:8]}.yaml", tmp_path / f"r-{k[:8]}"
        b.arch(k).save(arch)
        assert main(["retrain", "--arch", str(arch), "--config", str(conf), "--out", str(run),
                     "--set", f"retrain.seed={seed}", "--set", "retrain.measure_latency=false"]
                    ) == 0
        res = json.loads((run / "results.json").read_text())
        last = json.loads((run / "history.json").read_text())[-1]
        rec = b.networks[k]["runs"][str(seed)]["2"]
        got = (res["top1"], res["test_ce"], res["val_top1"], res["val_ce"],
               last["train_loss"], last["train_acc"])
        assert got == (rec["test_acc"], rec["test_ce"], rec["val_acc"], rec["val_ce"],
                       rec["train_loss"], rec["train_acc"]), (k, seed)


@pytest.mark.slow
def test_a_ray_worker_on_other_sources_stops_the_build_in_one_line(tmp_path, monkeypatch,
                                                                    capsys):
    # as if the driver ran other fbnas sources than the workers import
    monkeypatch.setattr(bench_build, "driver_code",
                        lambda: {"source_hash": "0" * 64, "package": "/elsewhere/fbnas"})
    conf = tmp_path / "c.yaml"
    conf.write_text(json.dumps(_cfg(tmp_path, epochs=1)))
    out = tmp_path / "b.json.gz"
    assert main(["bench", "build", "--config", str(conf), "--bench", str(out), "--workers", "2",
                 "--rounds", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("fbnas bench build: error: network ")
    assert f"imports fbnas from {PACKAGE}" in err and "/elsewhere/fbnas" in err
    assert not out.exists()


@pytest.mark.parametrize("workers", [[], pytest.param(["--workers", "2"], marks=pytest.mark.slow)])
def test_sweep_reads_the_benchmark_instead_of_retraining(built, tmp_path, capsys, workers):
    tmp, _, out, _ = built
    b = Bench.load(out)
    d = _cfg(tmp)
    d["search"].update({"epochs": 2, "warmup_epochs": 1})
    d["loss"] = {"kind": "target", "target": "0.5x", "lambda": 1.0}
    conf = tmp_path / "sweep.yaml"
    conf.write_text(json.dumps(d))
    sw = tmp_path / "sw"
    assert main(["sweep", "--config", str(conf), "--targets", "0.3x,0.8x", "--random", "1",
                 "--out", str(sw), "--bench", str(out), *workers]) == 0
    rep = json.loads((sw / "sweep.json").read_text())
    assert len(rep["points"]) >= 3
    for p in rep["points"]:
        assert p["top1"] == pytest.approx(b.mean(p["arch_hash"], "test_acc"))
        assert p["measured_us"] == pytest.approx(b.networks[p["arch_hash"]]["measured"])
    assert not list(sw.glob("retrain-*/checkpoint.pt"))  # nothing was trained
    # a sweep whose retrain is not the benchmark's would read the wrong records
    conf.write_text(json.dumps({**d, "retrain": {**d["retrain"], "lr": 0.2}}))
    assert main(["sweep", "--config", str(conf), "--targets", "0.5x", "--out",
                 str(tmp_path / "sw2"), "--bench", str(out)]) == 2
    assert "another data or retrain section" in capsys.readouterr().err


def test_exhaustive_training_keeps_each_seeds_best_validation_accuracy_ties_by_ce():
    from types import SimpleNamespace

    from fbnas.bench.score import exhaustive

    def runs(*by_seed):  # per seed: (val_acc, val_ce) at 20 epochs; at 6 a decoy best
        return {"runs": {str(s): {"6": {"val_acc": 0.99, "val_ce": 0.0},
                                  "20": {"val_acc": a, "val_ce": c}}
                         for s, (a, c) in enumerate(by_seed)}}
    b = SimpleNamespace(budgets=[6, 20], seeds=[0, 1], networks={
        "a": runs((0.90, 0.5), (0.80, 0.5)),
        "b": runs((0.85, 0.4), (0.90, 0.6)),
        "c": runs((0.90, 0.3), (0.70, 0.1))})
    # seed 0: a and c tie at 0.90, c has the lower CE; seed 1: b
    assert exhaustive(b, ["a", "b", "c"]) == ["c", "b"]
    assert exhaustive(b, ["a", "b"]) == ["a", "b"]
    assert exhaustive(b, []) == []


def test_figures_as_a_user_reads_them():
    """P(pick > a random network of its latency) with ties half, disjoint latency bands, and
    Kendall τ inside them weighted by their sizes."""
    from fbnas.bench.score import bands, beats, tau_within
    t = {k: {"latency": la, "acc": a} for k, la, a in (
        ("a", 100.0, 0.90), ("b", 101.0, 0.80), ("c", 102.0, 0.90), ("d", 99.0, 0.95),
        ("e", 200.0, 0.70))}
    assert beats(t, "a", 0.03) == pytest.approx((1 + 0.5 + 0) / 3)  # b lower, c tied, d higher
    assert beats(t, "d", 0.03) == pytest.approx(1.0)
    assert math.isnan(beats(t, "e", 0.03))  # nobody near its latency
    assert bands(t, 0.03) == [["d", "a", "b", "c"], ["e"]]
    # a band reaches (1 + near)² past its fastest network, then a new one starts
    t2 = {str(i): {"latency": 100.0 * 1.02 ** i, "acc": 0.5} for i in range(7)}
    assert [len(g) for g in bands(t2, 0.03)] == [3, 3, 1]
    x = {k: float(i) for i, k in enumerate("abcdefgh")}
    same, rev = dict(x), {k: -v for k, v in x.items()}
    groups = [list("abcde"), list("fgh")]
    assert tau_within(groups, x, same) == pytest.approx(1.0)
    assert tau_within(groups, x, rev) == pytest.approx(-1.0)
    assert tau_within([list("abcde"), list("fghij")][:1] + [list("fgh")], x, same,
                      smallest=3) == pytest.approx(1.0)
    mixed = {**same, **{k: -v for k, v in x.items() if k in "fgh"}}  # agree in one, not other
    assert tau_within([list("abcde"), list("fgh")], x, mixed, smallest=3) == pytest.approx(
        (5 * 1.0 + 3 * -1.0) / 8)
    assert math.isnan(tau_within([list("ab")], x, same))  # no band of 5


def test_score_names_a_folder_that_is_no_run_and_a_run_that_has_not_finished(built, searched,
                                                                               tmp_path):
    import shutil

    from fbnas.bench.score import score_run

    bench = Bench.load(built[2])
    empty = tmp_path / "empty"
    empty.mkdir()
    one_line_error(lambda: score_run(bench, empty), str(empty), "not a search run")
    unfinished = tmp_path / "unfinished"
    shutil.copytree(searched, unfinished)
    (unfinished / "arch_hard.yaml").unlink()
    one_line_error(lambda: score_run(bench, unfinished), "has not finished")
