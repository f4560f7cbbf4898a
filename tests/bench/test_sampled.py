"""A sampled benchmark (issue 51): a reference sample of N networks per target band drawn
uniformly from the networks predicted in it, plus added networks; built, resumed, added to,
shown, queried and scored with the same commands, every figure checked by hand from the file's
records."""

from __future__ import annotations

import itertools
import json
import math
import random

import pytest
from conftest import digits_run_config, one_line_error

import fbnas.bench.build as bench_build
import fbnas.bench.duel as duel
import fbnas.bench.sample as bench_sample
from fbnas._cli import main
from fbnas.arch import Architecture, arch_from_indices
from fbnas.bench.build import build_bench
from fbnas.bench.duel import PairStore, pair_picks
from fbnas.bench.sample import SampleSpec
from fbnas.bench.score import truth
from fbnas.bench.table import BENCH_SCHEMA, SAMPLED_SCHEMA, Bench
from fbnas.config import config_from_dict
from fbnas.errors import FbnasError
from fbnas.latency.resolve import resolve_costs
from tests.bench.spaces import SPACE64


def _cfg(tmp, latency=None, **retrain):
    d = digits_run_config(
        retrain={"epochs": 1, "lr": 0.05, "warmup_epochs": 0, "threads": 1, **retrain},
        space=SPACE64, data={"limit": 200}, latency=latency or {"cost": "flops"})
    d["run"]["dir"] = str(tmp / "run")
    return d


def _quiet(_: str) -> None:
    pass


def _draw(tmp, name, spec, latency=None):
    """A sampled build that trains nothing (limit 0): the file holds the draw only."""
    cfg = config_from_dict(_cfg(tmp, latency), "bench.yaml")
    lines: list[str] = []
    build_bench(cfg, tmp / name, seeds=(0,), limit=0, log=lines.append, sample=spec)
    return cfg, Bench.load(tmp / name), lines


def _every_cost(cfg):
    model = resolve_costs(cfg.space, cfg.latency, _quiet).model(cfg.space)
    return model, {arch_from_indices(cfg.space, list(i)).hash(): model.of(list(i))
                   for i in itertools.product(*(range(len(c)) for c in
                                                cfg.space.decision_candidates()))}


# ---- the draw (nothing trained) ----------------------------------------------------------------
def test_every_reference_network_is_drawn_from_its_band(tmp_path):
    spec = SampleSpec(3, ("0.3x", "0.5x", "0.8x"), 0.1, 0)
    cfg, b, lines = _draw(tmp_path, "s.json.gz", spec)
    assert b.sampled and len(b) == 0 and b.spec == spec
    model, cost = _every_cost(cfg)
    lo, hi = model.bounds()
    for band in b.meta["sample"]["band_list"]:
        frac = float(band["target"][:-1])
        target = lo + frac * (hi - lo)  # loss.target's `Fx`, by hand
        assert band["cost"] == pytest.approx(target)
        members = {h for h, c in cost.items() if abs(c / target - 1) <= 0.1}
        drawn = [n["hash"] for n in band["networks"]]
        assert band["exact"] and band["in_space"] == len(members)
        assert len(drawn) == len(set(drawn)) == min(3, len(members)) and set(drawn) <= members
        for n in band["networks"]:
            assert arch_from_indices(cfg.space, n["indices"]).hash() == n["hash"]
    assert b.band_keys() == {bd["target"]: [n["hash"] for n in bd["networks"]]
                             for bd in b.meta["sample"]["band_list"]}
    assert set(b.reference()) == {h for ks in b.band_keys().values() for h in ks}
    assert b.meta["sample"]["space_networks"] == 64 and b.added() == []
    with open(tmp_path / "s.json.gz", "rb") as f:  # written before anything trained
        import gzip
        assert json.loads(gzip.decompress(f.read()))["fbnas_bench"] == SAMPLED_SCHEMA


def test_a_band_with_fewer_networks_gives_them_all_and_says_so(tmp_path):
    cfg = config_from_dict(_cfg(tmp_path), "bench.yaml")
    _, cost = _every_cost(cfg)
    model, _ = _every_cost(cfg)
    lo, hi = model.bounds()
    target = lo + 0.3 * (hi - lo)
    members = [h for h, c in cost.items() if abs(c / target - 1) <= 0.03]
    assert 0 < len(members) < 5  # the FLOPs of this space leave 0.3x ± 3% nearly empty
    _, b, lines = _draw(tmp_path, "s.json.gz", SampleSpec(5, ("0.3x",), 0.03, 0))
    assert sorted(b.band_keys()["0.3x"]) == sorted(members)
    said = [ln for ln in lines if "band 0.3x" in ln]
    assert said and f"holds only {len(members)} network(s)" in said[0]
    assert f"{len(members)} in the sample, not 5" in said[0]


def test_the_draw_is_fixed_by_the_sample_seed(tmp_path):
    spec = SampleSpec(3, ("0.5x", "0.8x"), 0.1, 7)
    _, a, _ = _draw(tmp_path, "a.json.gz", spec)
    _, b, _ = _draw(tmp_path, "b.json.gz", spec)
    _, c, _ = _draw(tmp_path, "c.json.gz", SampleSpec(3, ("0.5x", "0.8x"), 0.1, 8))
    assert a.band_keys() == b.band_keys() != c.band_keys()
    # a band's draw does not depend on the other bands
    _, d, _ = _draw(tmp_path, "d.json.gz", SampleSpec(3, ("0.8x",), 0.1, 7))
    assert d.band_keys()["0.8x"] == a.band_keys()["0.8x"]


def test_a_space_too_large_to_enumerate_is_sampled_by_rejection(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_sample, "ENUMERATE", 10)  # as if 64 networks were too many
    cfg, b, _ = _draw(tmp_path, "r.json.gz", SampleSpec(3, ("0.5x",), 0.1, 0))
    model, cost = _every_cost(cfg)
    lo, hi = model.bounds()
    target = lo + 0.5 * (hi - lo)
    (band,) = b.meta["sample"]["band_list"]
    assert not band["exact"] and band["draws"] >= 3 and band["in_space"] > 0
    drawn = b.band_keys()["0.5x"]
    assert len(set(drawn)) == 3 and all(abs(cost[h] / target - 1) <= 0.1 for h in drawn)
    _, again, _ = _draw(tmp_path, "r2.json.gz", SampleSpec(3, ("0.5x",), 0.1, 0))
    assert again.band_keys() == b.band_keys()


def test_an_empty_band_is_one_line(tmp_path):
    cfg = config_from_dict(_cfg(tmp_path), "bench.yaml")
    out = tmp_path / "e.json.gz"
    one_line_error(lambda: build_bench(cfg, out, seeds=(0,), limit=0, log=_quiet,
                                       sample=SampleSpec(3, ("0.01x",), 0.03, 0)),
                   "band 0.01x", "no network of its 64 lies in it", "--band-width")
    assert not out.exists()


@pytest.mark.parametrize("flags, needles", [
    (["--targets", "0.5x"], ["--targets: only for a sampled benchmark", "--sample N"]),
    (["--seed", "3"], ["--seed: only for a sampled benchmark"]),
    (["--add", "a.yaml"], ["--add: only for a sampled benchmark"]),
    (["--sample", "0"], ["--sample 0", ">= 1"]),
    (["--sample", "2", "--targets", "0.5y"], ["--targets '0.5y'", "cannot read"]),
    (["--sample", "2", "--targets", "0.5x,0.5x"], ["a band is named twice"]),
    (["--sample", "2", "--band-width", "1.5"], ["--band-width 1.5", "> 0 and < 1"]),
    (["--sample", "2", "--band-width", "0"], ["--band-width 0.0"]),
])
def test_bad_sample_flags_are_one_line(tmp_path, capsys, flags, needles):
    conf = tmp_path / "c.yaml"
    conf.write_text(json.dumps(_cfg(tmp_path)))
    out = tmp_path / "b.json.gz"
    assert main(["bench", "build", "--config", str(conf), "--bench", str(out), "--limit", "0",
                 *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("fbnas bench build: error: ")
    for n in needles:
        assert n in err, (n, err)
    assert not out.exists()


def test_a_file_refuses_another_draw_or_the_other_kind(tmp_path, capsys):
    spec = SampleSpec(2, ("0.5x",), 0.1, 0)
    cfg, b, _ = _draw(tmp_path, "s.json.gz", spec)
    out = tmp_path / "s.json.gz"
    one_line_error(lambda: build_bench(cfg, out, seeds=(0,), limit=0, log=_quiet,
                                       sample=SampleSpec(2, ("0.5x",), 0.1, 1)),
                   "drawn with --sample 2 --targets 0.5x --band-width 0.1 --seed 0",
                   "not --sample 2 --targets 0.5x --band-width 0.1 --seed 1")
    one_line_error(lambda: build_bench(cfg, out, seeds=(0,), limit=0, log=_quiet),
                   "a sampled benchmark (--sample 2", "fbnas bench add")
    # an exhaustive file (one network trained, no sample) takes neither a draw nor additions
    ex = Bench.load(out)
    del ex.meta["sample"]
    ex.networks["x"] = {"ops": [], "runs": {}}
    ex_path = ex.save(tmp_path / "ex.json.gz")
    one_line_error(lambda: build_bench(cfg, ex_path, seeds=(0,), limit=0, log=_quiet,
                                       sample=spec), "an exhaustive benchmark", "a new file")
    arch = tmp_path / "a.yaml"
    arch_from_indices(cfg.space, [0, 0, 0]).save(arch)
    conf = tmp_path / "c.yaml"
    conf.write_text(json.dumps(_cfg(tmp_path)))
    assert main(["bench", "add", "--bench", str(ex_path), str(arch), "--config", str(conf)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "an exhaustive benchmark holds every network" in err
    with open(ex_path, "rb") as f:
        import gzip
        assert json.loads(gzip.decompress(f.read()))["fbnas_bench"] == BENCH_SCHEMA


def test_an_added_architecture_outside_the_space_is_one_line(tmp_path, capsys):
    cfg, _, _ = _draw(tmp_path, "s.json.gz", SampleSpec(2, ("0.5x",), 0.1, 0))
    a = arch_from_indices(cfg.space, [0, 0, 0])
    bad = tmp_path / "bad.yaml"
    Architecture(a.macro, [a.ops[0], "ir_k5_e6", a.ops[2]], "bad", a.space).save(bad)
    conf = tmp_path / "c.yaml"
    conf.write_text(json.dumps(_cfg(tmp_path)))
    assert main(["bench", "add", "--bench", str(tmp_path / "s.json.gz"), str(bad), "--config",
                 str(conf)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "layer 1 op 'ir_k5_e6'" in err and str(bad) in err
    assert Bench.load(tmp_path / "s.json.gz").added() == []


def test_a_duels_picks_are_added_from_its_pair_file(tmp_path, capsys):
    """`fbnas bench add BENCH --pairs FILE`: both picks of every finished pair of a duel,
    trained into the sampled file (an unfinished pair is skipped); bad pair files are one
    line."""
    cfg, drawn, _ = _draw(tmp_path, "s.json.gz", SampleSpec(2, ("0.5x",), 0.1, 0))
    space = cfg.space
    # two networks outside the reference sample, each within ±3% of one in it (a percentile
    # is read among those)
    model, cost = _every_cost(cfg)
    ref = [cost[k] for k in drawn.reference()]
    near = [arch_from_indices(space, list(i)) for i in itertools.product(
        *(range(len(c)) for c in space.decision_candidates()))
        if any(abs(model.of(list(i)) / r - 1) <= 0.03 for r in ref)]
    a, b = [x for x in near if x.hash() not in drawn.reference()][:2]
    pairs = {"0.5x/seed3": {"target": "0.5x", "seed": 3, "retrain": {
                 "search": {"ops": list(a.ops), "hash": a.hash()},
                 "random": {"ops": list(b.ops), "hash": b.hash()}}},
             "0.8x/seed3": {"target": "0.8x", "seed": 3, "search": {"seconds": 1.0}}}
    f = tmp_path / "pairs.json"
    f.write_text(json.dumps({"pairs": pairs}))
    picks = pair_picks(f, space)
    assert [(p.hash(), src) for p, src in picks] == [
        (a.hash(), f"{f}:0.5x/seed3:search"), (b.hash(), f"{f}:0.5x/seed3:random")]
    conf = tmp_path / "c.yaml"
    conf.write_text(json.dumps(_cfg(tmp_path)))
    assert main(["bench", "add", "--bench", str(tmp_path / "s.json.gz"), "--pairs", str(f),
                 "--config", str(conf)]) == 0
    got = Bench.load(tmp_path / "s.json.gz")
    assert got.added() == [a.hash(), b.hash()] and all(got.complete(h) for h in got.added())
    capsys.readouterr()

    # the duel run again with the benchmark (its reference sample trained now): each pick's
    # percentile filled from the file's truth (no stage runs again), by hand: the share of the
    # reference networks within ±3% of its latency it is at least as accurate as
    build_bench(cfg, tmp_path / "s.json.gz", seeds=(0,), log=_quiet,
                sample=SampleSpec(2, ("0.5x",), 0.1, 0))
    got = Bench.load(tmp_path / "s.json.gz")
    done = json.loads(json.dumps(pairs))
    done["0.5x/seed3"].update(search={"seconds": 1.0}, random={"r": 1.0})
    for side in ("search", "random"):
        done["0.5x/seed3"]["retrain"][side].update(latency=1.0, mean_test_acc=0.5)
    st_path = tmp_path / "duel" / "pairs.json"
    st_path.parent.mkdir()
    st_path.write_text(json.dumps({"pairs": done}))
    rec = duel.run_pair(PairStore(st_path), conf, "0.5x", 3, tmp_path / "duel", [9],
                        bench=got, log=_quiet)
    t = truth(got)
    for side, arch in (("search", a), ("random", b)):
        lat, acc = t[arch.hash()]["latency"], t[arch.hash()]["acc"]
        pool = [k for k in got.reference() if k in t and abs(t[k]["latency"] / lat - 1) <= 0.03]
        want = 100 * sum(t[k]["acc"] <= acc for k in pool) / len(pool) if pool else math.nan
        p = PairStore(st_path).get("0.5x", 3)["retrain"][side]
        assert p["percentile_by"] == "bench" == rec["retrain"][side]["percentile_by"]
        assert p["percentile"] == pytest.approx(want, nan_ok=True)
        assert pool and not math.isnan(want)

    bad = json.loads(json.dumps(pairs))
    bad["0.5x/seed3"]["retrain"]["random"]["ops"][1] = "ir_k7_e9"
    f.write_text(json.dumps({"pairs": bad}))
    one_line_error(lambda: pair_picks(f, space), "0.5x/seed3 random", "not a network of space")
    bad["0.5x/seed3"]["retrain"]["random"] = {"ops": list(b.ops), "hash": a.hash()}
    f.write_text(json.dumps({"pairs": bad}))
    one_line_error(lambda: pair_picks(f, space), "another space")
    f.write_text(json.dumps({"pairs": {"0.8x/seed3": pairs["0.8x/seed3"]}}))
    one_line_error(lambda: pair_picks(f, space), "no finished pair")
    f.write_text("[1, 2]")
    one_line_error(lambda: pair_picks(f, space), "not a duel's pair file")
    one_line_error(lambda: pair_picks(tmp_path / "none.json", space), "no such file")


# ---- built: trained, timed, added to, scored --------------------------------------------------
BANDS = ("0.5x", "0.8x")


@pytest.fixture(scope="module")
def sampled(tmp_path_factory):
    """3 networks per band (0.5x, 0.8x ± 5%) of the 64, 2 seeds, 1 epoch, timed on the fake
    device; then a 2-epoch search at 0.5x whose pick is added with `fbnas bench add`."""
    tmp = tmp_path_factory.mktemp("sampled")
    lat = {"cost": "latency", "device": "fake", "cache_dir": str(tmp / "cache")}
    d = _cfg(tmp, lat)
    conf = tmp / "bench.yaml"
    conf.write_text(json.dumps(d))
    out = tmp / "s.json.gz"
    assert main(["bench", "build", "--config", str(conf), "--bench", str(out), "--rounds", "3",
                 "--sample", "3", "--targets", ",".join(BANDS), "--band-width", "0.05"]) == 0
    s = dict(d)
    s["search"] = {**d["search"], "epochs": 2, "warmup_epochs": 1}
    s["loss"] = {"kind": "target", "target": "0.5x", "lambda": 1.0}
    s["run"] = {**d["run"], "dir": str(tmp / "search")}
    sconf = tmp / "search.yaml"
    sconf.write_text(json.dumps(s))
    assert main(["train", "--config", str(sconf)]) == 0
    return tmp, conf, out, tmp / "search"


def _truth(b: Bench):
    """Per complete network: (latency measured end to end, mean test top-1 at the full
    budget), by hand from the file's records."""
    full = str(b.budgets[-1])
    return {k: (b.networks[k]["measured"],
                sum(b.networks[k]["runs"][str(s)][full]["test_acc"] for s in b.seeds)
                / len(b.seeds))
            for k in b if b.complete(k)}


def test_a_sampled_build_trains_and_times_the_reference_sample(sampled):
    tmp, conf, out, _ = sampled
    b = Bench.load(out)
    assert b.sampled and b.seeds == [0, 1] and b.budgets == [1]
    sp = b.meta["sample"]
    assert (sp["n"], sp["bands"], sp["band_width"], sp["seed"]) == (3, list(BANDS), 0.05, 0)
    cfg = config_from_dict(json.loads(conf.read_text()), str(conf))
    model = resolve_costs(cfg.space, cfg.latency, _quiet).model(cfg.space)
    for band in sp["band_list"]:
        assert len(band["networks"]) == min(3, band["in_space"])
        for n in band["networks"]:
            k = n["hash"]
            assert b.complete(k)
            net = b.networks[k]
            # predicted as the search's fit predicts it, and inside its band
            assert net["predicted"] == pytest.approx(model.of(n["indices"]), abs=1e-3)
            assert abs(model.of(n["indices"]) / band["cost"] - 1) <= 0.05 + 1e-9
            assert net["measured"] > 0 and net["params"] > 0 and net["flops"] > 0
            for s in ("0", "1"):
                rec = net["runs"][s]["1"]
                assert set(rec) == {"train_acc", "train_loss", "val_acc", "val_ce", "test_acc",
                                    "test_ce", "seconds"}
    assert set(b.reference()) <= set(b.networks)


def test_show_and_query_say_sampled(sampled, capsys):
    _, _, out, _ = sampled
    b = Bench.load(out)
    assert main(["bench", "show", "--bench", str(out)]) == 0
    said = capsys.readouterr().out
    assert "a SAMPLED benchmark" in said and "sample seed 0" in said
    for band, keys in b.band_keys().items():
        assert f"band {band}: " in said and f"{len(keys)} drawn, {len(keys)} complete" in said
    assert "64 networks" in said and "of the reference sample" in said
    k = b.band_keys()["0.8x"][0]
    arch = out.parent / "q.yaml"
    b.arch(k).save(arch)
    assert main(["bench", "query", str(arch), "--bench", str(out)]) == 0
    said = capsys.readouterr().out
    assert "drawn in band 0.8x" in said and "among the reference sample" in said
    assert f"of {len(set(b.reference()))};" in said


@pytest.fixture(scope="module")
def added(sampled):
    """The sampled benchmark with the search's pick added by `fbnas bench add`."""
    tmp, conf, out, search = sampled
    assert main(["bench", "add", "--bench", str(out), str(search / "arch_hard.yaml"), "--config",
                 str(conf), "--rounds", "3"]) == 0
    return sampled


def test_a_pick_not_in_the_file_is_one_line_naming_the_add_command(sampled, tmp_path,
                                                                   capsys):
    """Not in the file: a one-line error naming the add command; `fbnas bench add` trains it
    under the file's seeds (and only it), a second add trains nothing."""
    from fbnas.bench.score import score_run
    _, conf, out, search = sampled
    b = Bench.load(out)
    space = b.space
    other = next(a for a in (arch_from_indices(space, list(i)) for i in itertools.product(
        *(range(len(c)) for c in space.decision_candidates()))) if a.hash() not in b.networks)
    run = tmp_path / "run"
    run.mkdir()
    for f in search.iterdir():  # the search run, its pick replaced by a network not in the file
        if f.is_file():
            (run / f.name).write_bytes(f.read_bytes())
    other.save(run / "arch_hard.yaml")
    b.meta["sample"]["added"] = []  # as built, whatever the other tests added
    copy = b.save(tmp_path / "copy.json.gz")
    b = Bench.load(copy)
    one_line_error(lambda: score_run(b, run, trials=2, rank=False),
                   "is not in the sampled benchmark", f"fbnas bench add {copy}",
                   f"--config {conf}")
    assert main(["bench", "score", str(run), "--bench", str(copy), "--no-rank"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "fbnas bench add" in err
    assert main(["bench", "add", "--bench", str(copy), str(run / "arch_hard.yaml"), "--config",
                 str(conf), "--rounds", "3"]) == 0
    b = Bench.load(copy)
    h = other.hash()
    assert b.added() == [h] and b.complete(h) and b.networks[h]["measured"] > 0
    assert b.meta["sample"]["added"][0]["from"] == str(run / "arch_hard.yaml")
    assert set(b.networks[h]["runs"]) == {"0", "1"} and h not in b.reference()
    before = {k: v["runs"] for k, v in b.networks.items()}
    # again, and a reference network: nothing is trained; both are recorded as added
    ref0 = b.reference()[0]
    b.arch(ref0).save(tmp_path / "ref0.yaml")
    assert main(["bench", "add", "--bench", str(copy), str(run / "arch_hard.yaml"),
                 str(tmp_path / "ref0.yaml"), "--config", str(conf), "--rounds", "3"]) == 0
    again = Bench.load(copy)
    assert again.added() == [h, ref0]
    assert {k: v["runs"] for k, v in again.networks.items()} == before
    capsys.readouterr()


def test_score_on_a_sampled_benchmark_by_hand(added, tmp_path, capsys):
    from fbnas.bench.score import score_run
    tmp, conf, out, search = added
    pick = Architecture.load(search / "arch_hard.yaml")
    b = Bench.load(out)
    # one epoch on 200 digits leaves most networks tied: the figures are checked on a copy
    # whose accuracies are spread apart (score reads nothing else of them)
    rng = random.Random(0)
    for net in b.networks.values():
        for by in net["runs"].values():
            for r in by.values():
                r["test_acc"], r["val_acc"] = round(rng.random(), 4), round(rng.random(), 4)
    out = b.save(tmp_path / "spread.json.gz")
    b = Bench.load(out)
    t = _truth(b)
    ref = {k: t[k] for k in b.reference()}
    k = pick.hash()
    lat, acc = t[k]
    near = 0.1
    s = score_run(b, search, near=near, trials=20, rank=False)
    pool = [j for j, (la, _) in ref.items() if abs(la / lat - 1) <= near]
    assert s.sampled and s.reference == len(ref) and s.matched == len(pool) >= 1
    assert s.latency == lat and s.true_acc == pytest.approx(acc)
    assert s.percentile == pytest.approx(100 * sum(ref[j][1] <= acc for j in pool) / len(pool))
    assert s.regret == pytest.approx(max([acc] + [a for la, a in ref.values() if la <= lat])
                                     - acc)
    others = [ref[j][1] for j in pool if j != k]
    if others:
        assert s.beats_random == pytest.approx(sum(
            1.0 if a < acc else 0.5 if a == acc else 0.0 for a in others) / len(others))

    def reg(j):
        return max([t[j][1]] + [a for la, a in ref.values() if la <= t[j][0]]) - t[j][1]
    assert s.random_regret == pytest.approx(sum(map(reg, pool)) / len(pool))
    # on the target: the reference networks measured within the fit's tolerance of it
    target = s.target
    allowed = [j for j, (la, _) in ref.items() if abs(la / target - 1) <= 0.03]
    assert s.on_target == len(allowed)
    if allowed:
        assert not s.omitted
        assert s.on_target_regret == pytest.approx(min(map(reg, allowed)))
        val = [max(allowed, key=lambda j: (b.networks[j]["runs"][str(sd)]["1"]["val_acc"],
                                           -b.networks[j]["runs"][str(sd)]["1"]["val_ce"]))
               for sd in b.seeds]
        assert s.exhaustive_regret == pytest.approx(sum(map(reg, val)) / len(val))
    else:
        assert "no network of the reference sample" in s.omitted
        assert math.isnan(s.on_target_regret) and math.isnan(s.exhaustive_regret)
    # the CLI says the truth is sampled
    assert main(["bench", "score", str(search), "--bench", str(out), "--no-rank", "--trials",
                 "5", "--near", str(near), "--json", str(tmp_path / "s.json")]) == 0
    said = capsys.readouterr().out
    assert "the truth is SAMPLED" in said and "(of the reference sample)" in said
    assert "random search over the sample (" in said and "over the sample: its target" in said
    rec = json.loads((tmp_path / "s.json").read_text())[0]
    assert rec["sampled"] is True and rec["reference"] == len(ref)
    # a reference network as the pick counts itself among its band, as an exhaustive one does
    best = max(ref, key=lambda j: ref[j][1])
    b.arch(best).save(search / "arch_hard.yaml")
    try:
        s = score_run(b, search, near=near, trials=5, rank=False)
        assert s.regret == 0 and s.percentile == 100 and s.on_target == 0 and not s.omitted
    finally:
        pick.save(search / "arch_hard.yaml")


def test_a_pick_no_reference_network_is_near_is_one_line(added, tmp_path):
    from fbnas.bench.score import score_run
    _, conf, out, search = added
    b = Bench.load(out)
    pick = Architecture.load(search / "arch_hard.yaml")
    lat = b.networks[pick.hash()]["measured"]
    # a sample whose bands hold no network within ±3% of the pick's latency
    for band in b.meta["sample"]["band_list"]:
        band["networks"] = [n for n in band["networks"] if n["hash"] != pick.hash()
                            and abs(b.networks[n["hash"]]["measured"] / lat - 1) > 0.03]
    far = b.save(tmp_path / "far.json.gz")
    one_line_error(lambda: score_run(Bench.load(far), search, near=0.03, trials=2,
                                     rank=False),
                   "no network of", "reference sample lies within ±3%",
                   "build a sampled benchmark with a band at its target")


def test_on_target_figures_are_omitted_where_the_sample_has_none_on_target(added, tmp_path):
    """The fit's rule in a gap needs every network: where no reference network is measured
    within the fit's tolerance of the target, the on-target and exhaustive figures are NaN and
    `omitted` says why; the others are still read over the sample."""
    from fbnas.bench.score import score_run
    _, _, out, search = added
    b = Bench.load(out)
    pick = Architecture.load(search / "arch_hard.yaml")
    target = float(pick.meta["target"])
    for band in b.meta["sample"]["band_list"]:
        band["networks"] = [n for n in band["networks"]
                            if abs(b.networks[n["hash"]]["measured"] / target - 1) > 0.03]
    path = b.save(tmp_path / "gap.json.gz")
    s = score_run(Bench.load(path), search, near=0.1, trials=2, rank=False)
    assert s.matched >= 1 and s.on_target == 0  # the sample still has networks near it
    assert "no network of the reference sample is measured within ±3% of the target" in (
        s.omitted)
    assert math.isnan(s.on_target_regret) and math.isnan(s.exhaustive_regret)


@pytest.mark.slow
def test_an_interrupted_sampled_build_resumes_keeping_the_networks_done(tmp_path,
                                                                       monkeypatch):
    cfg = config_from_dict(_cfg(tmp_path), "bench.yaml")
    out = tmp_path / "s.json.gz"
    spec = SampleSpec(2, ("0.5x", "0.8x"), 0.1, 0)
    real, calls = bench_build.train_one, []

    def dies_on_the_second(c, a, s, bud, w):
        calls.append(a.hash())
        if len(calls) == 2:
            raise KeyboardInterrupt  # killed while training the second network
        return real(c, a, s, bud, w)
    monkeypatch.setattr(bench_build, "train_one", dies_on_the_second)
    with pytest.raises(KeyboardInterrupt):
        build_bench(cfg, out, seeds=(0,), log=_quiet, sample=spec)
    first = Bench.load(out)
    assert [k for k in first if first.complete(k)] == calls[:1]
    # the reference is interleaved over the bands: the first network is 0.5x's first
    assert calls[0] == first.band_keys()["0.5x"][0]
    trained = []
    monkeypatch.setattr(bench_build, "train_one",
                        lambda c, a, s, bud, w: trained.append(a.hash()) or real(c, a, s, bud, w))
    build_bench(cfg, out, seeds=(0,), log=_quiet, sample=spec)
    again = Bench.load(out)
    ref = again.reference()
    assert len(ref) == 4 and all(again.complete(k) for k in ref)
    assert sorted(trained) == sorted(set(ref) - {calls[0]})
    assert again.networks[calls[0]]["runs"] == first.networks[calls[0]]["runs"]
    assert again.band_keys() == first.band_keys()
    # another recipe is refused, as for an exhaustive build
    other = config_from_dict(_cfg(tmp_path, lr=0.1), "other.yaml")
    with pytest.raises(FbnasError, match="another training than other.yaml gives"):
        build_bench(other, out, seeds=(0,), log=_quiet, sample=spec)


def test_fidelity_ranks_the_reference_sample(added, tmp_path):
    """`fbnas fidelity --bench` on a sampled file reads its reference networks (and the run's
    pick, added), not random networks of the space it does not hold."""
    _, _, out, search = added
    b = Bench.load(out)
    pick = Architecture.load(search / "arch_hard.yaml").hash()
    assert main(["fidelity", str(search), "--bench", str(out), "--out",
                 str(tmp_path / "f")]) == 0
    rep = json.loads((tmp_path / "f" / "fidelity.json").read_text())
    assert {p["hash"] for p in rep["points"]} == {*b.reference(), pick}
    for p in rep["points"]:
        assert p["standalone_val_top1"] == pytest.approx(b.mean(p["hash"], "val_acc"))
