"""The ground-truth benchmark file and its query API (NAS-Bench-101's, for an fbnas space).

A benchmark holds every network of a small space trained with the child recipe (`fbnas
retrain`'s) under several seeds, with records at several budgets (epochs of that one schedule),
and each network's latency: predicted by the space's table and measured end to end.

    bench = Bench.load("configs/bench_digits.json.gz")
    rec = bench.query(arch)                  # one seed's record at the full budget; counts it
    bench.spent_seconds, bench.spent_epochs  # what the queries would have cost to train
    bench.records(arch)                      # every seed and budget (analysis: not counted)
    for key in bench: bench.mean(key, "val_acc")
    bench.front("val_acc")                   # the accuracy-latency Pareto front

The file is gzip'd JSON (`BENCH_SCHEMA`), written atomically; `networks` maps an architecture's
hash to {"ops", "params", "flops", "predicted", "measured", "runs": {seed: {budget: record}}}
(and "channels", the stages' widths, in a width-searched space). The meta holds the space, the
training (`training_record`), budgets, seeds, latency source, versions, the machine and, since
2026-11-27, "code": the code and machine each sitting of the build trained on
(`fbnas.runs.provenance.code_record`: commit, local changes, the sources' hash; plus "machine"), the
first being the commit it was built at; a file from before has none (`Bench.code` is then
empty) and loads as it did.

A sampled benchmark (`fbnas bench build --sample N`, fbnas.bench.sample) holds,
instead of every network, a reference sample of N networks per target band drawn uniformly
from those predicted in it, plus networks added later (a search's picks); its meta's "sample"
says so: {"n", "bands", "band_width", "seed", "unit", "space_networks", "band_list": [{"target",
"cost", "lo", "hi", "in_space", "exact", "draws", "networks": [{"hash", "indices"}]}], "added":
[{"hash", "indices", "from"}]}, and it is written as schema 2, which an fbnas from before
refuses rather than read as exhaustive. `Bench.sampled`, `reference()`, `band_keys()`,
`added()`; an exhaustive file's `reference()` is every network.
"""

from __future__ import annotations

import gzip
import json
import math
import random
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fbnas.arch import Architecture, arch_from_indices
from fbnas.bench import METRICS
from fbnas.bench.sample import SampleSpec
from fbnas.errors import FbnasError
from fbnas.io import atomic_write, check_schema
from fbnas.search_space import SearchSpace

BENCH_SCHEMA = 1  # an exhaustive benchmark (every network of its space)
SAMPLED_SCHEMA = 2  # a sampled one: a reader that does not know the "sample" key refuses it


def training_record(cfg: Any) -> dict[str, Any]:
    """What fixes an entry's training: the data and retrain sections (but the seed) and the
    split's seed."""
    r = cfg.resolved()
    retrain = {k: v for k, v in r["retrain"].items() if k not in ("seed", "measure_latency")}
    return {"data": r["data"], "retrain": retrain, "split_seed": cfg.search.seed}


class Bench:
    """Every network of one space, trained and timed (see the module docstring)."""

    def __init__(self, meta: dict[str, Any], networks: dict[str, dict[str, Any]],
                 path: Path | None = None):
        self.meta = meta
        self.networks = networks
        self.path = path
        self.space = SearchSpace.from_dict(meta["space"])
        self.budgets: list[int] = [int(b) for b in meta["budgets"]]
        self.seeds: list[int] = [int(s) for s in meta["seeds"]]
        self.spent_seconds = 0.0
        self.spent_epochs = 0
        self._rng = random.Random(0)

    # ---- the file ----------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | Path) -> Bench:
        p = Path(path)
        try:
            with gzip.open(p, "rt", encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            raise FbnasError(f"{p}: no such benchmark file") from None
        except (OSError, EOFError, json.JSONDecodeError, UnicodeDecodeError) as e:
            raise FbnasError(f"{p}: not a benchmark file (gzip'd JSON): {e}") from None
        if not isinstance(data, dict) or "fbnas_bench" not in data:
            raise FbnasError(f"{p}: not a benchmark file (no 'fbnas_bench' schema key)")
        check_schema(f"{p}: fbnas_bench", data["fbnas_bench"],
                     SAMPLED_SCHEMA if "sample" in data else BENCH_SCHEMA,
                     "upgrade fbnas to read it", "rebuild it with `fbnas bench build`")
        networks = data.pop("networks", {})
        return cls(data, networks, p)

    def save(self, path: str | Path | None = None) -> Path:
        p = Path(path or self.path)
        data = {"fbnas_bench": SAMPLED_SCHEMA if self.sampled else BENCH_SCHEMA,
                **{k: v for k, v in self.meta.items() if k != "fbnas_bench"},
                "networks": self.networks}
        blob = gzip.compress(json.dumps(data, separators=(",", ":")).encode(), mtime=0)
        atomic_write(p, lambda f: f.write(blob), mode="wb")
        self.path = p
        return p

    @property
    def code(self) -> list[dict[str, Any]]:
        """The code records of the build's sittings (`fbnas.runs.provenance.code_record` and the
        machine), the first that it was built at; empty for a file from before they were
        recorded."""
        return list(self.meta.get("code") or [])

    # ---- a sampled benchmark -----------------------------------------------------------------
    @property
    def sampled(self) -> bool:
        """Whether the file holds a reference sample of its space, not every network."""
        return "sample" in self.meta

    @property
    def spec(self) -> Any:
        """The sample's `SampleSpec` (None for an exhaustive benchmark)."""
        return SampleSpec.from_meta(self.meta["sample"]) if self.sampled else None

    def band_keys(self) -> dict[str, list[str]]:
        """Per band (its target as written): the hashes of its drawn networks, in drawing
        order ({} for an exhaustive benchmark)."""
        if not self.sampled:
            return {}
        return {b["target"]: [n["hash"] for n in b["networks"]]
                for b in self.meta["sample"]["band_list"]}

    def reference(self) -> list[str]:
        """The networks the truth is read over: the reference sample's (each once; complete
        or not), or every network of an exhaustive benchmark."""
        if not self.sampled:
            return list(self.networks)
        return list(dict.fromkeys(k for ks in self.band_keys().values() for k in ks))

    def added(self) -> list[str]:
        """The networks added to a sampled benchmark (a search's or a baseline's picks)."""
        return [n["hash"] for n in self.meta.get("sample", {}).get("added", [])]

    def add_command(self, arch: str = "ARCH.yaml") -> str:
        config = self.meta.get("config") or "BENCH.yaml"
        return f"fbnas bench add {self.path or 'FILE'} {arch} --config {config}"

    # ---- networks ----------------------------------------------------------------------------
    def key(self, arch: Architecture | str, where: str = "architecture") -> str:
        """The hash of `arch` in this benchmark; one outside the space is a one-line error
        naming the layer and op."""
        if isinstance(arch, str):
            if arch not in self.networks:
                raise FbnasError(f"{where}: no network {arch!r} in the benchmark")
            return arch
        arch.check_fits(self.space, where)
        h = arch.hash()
        if h not in self.networks and self.sampled and h in {*self.reference(), *self.added()}:
            raise FbnasError(f"{where}: {arch.short_hash} is in the sampled benchmark "
                             f"{self.path or ''} but not trained yet (an unfinished build: "
                             "resume it)")
        if h not in self.networks and self.sampled:
            raise FbnasError(f"{where}: {arch.short_hash} is not in the sampled benchmark "
                             f"{self.path or ''} (neither drawn nor added); add it with `"
                             f"{self.add_command(where)}`")
        if h not in self.networks:
            raise FbnasError(f"{where}: {arch.short_hash} is in the space but not in the "
                             f"benchmark {self.path or ''} (an unfinished build?)")
        return h

    def arch(self, key: str) -> Architecture:
        n = self.networks[key]
        idx = [c.index(op) for c, op in zip(self.space.layer_candidates(), n["ops"], strict=True)]
        if "channels" in n:  # a width-searched space: its stages' channels
            idx += [self.space.width_choices(s).index(n["channels"][s])
                    for s in self.space.width_stages()]
        return arch_from_indices(self.space, idx, f"{self.space.name}_{key[:12]}")

    def __iter__(self) -> Iterator[str]:
        return iter(self.networks)

    def __len__(self) -> int:
        return len(self.networks)

    def complete(self, key: str) -> bool:
        """Trained under every seed to every budget."""
        runs = self.networks.get(key, {}).get("runs", {})
        return all(str(b) in runs.get(str(s), {}) for s in self.seeds for b in self.budgets)

    # ---- queries -----------------------------------------------------------------------------
    def _budget(self, budget: int | None) -> int:
        b = self.budgets[-1] if budget is None else int(budget)
        if b not in self.budgets:
            raise FbnasError(f"budget {budget}: the benchmark records "
                             f"{', '.join(map(str, self.budgets))} epochs")
        return b

    def query(self, arch: Architecture | str, budget: int | None = None,
              seed: int | None = None) -> dict[str, Any]:
        """One seed's record (a random seed unless given) at `budget` epochs (default the
        largest), with the network's fixed figures; adds what training it would have cost to
        `spent_seconds` / `spent_epochs`, as a search that trained it would have spent."""
        k = self.key(arch)
        b = self._budget(budget)
        s = self._rng.choice(self.seeds) if seed is None else int(seed)
        if s not in self.seeds:
            raise FbnasError(f"seed {seed}: the benchmark holds seeds "
                             f"{', '.join(map(str, self.seeds))}")
        net = self.networks[k]
        rec = net["runs"][str(s)][str(b)]
        self.spent_seconds += float(rec["seconds"])
        self.spent_epochs += b
        return {**self._fixed(k), "seed": s, "budget": b, **rec}

    def records(self, arch: Architecture | str) -> list[dict[str, Any]]:
        """Every (seed, budget) record of the network, for analysis: not counted."""
        k = self.key(arch)
        return [{**self._fixed(k), "seed": int(s), "budget": int(b), **rec}
                for s, by in sorted(self.networks[k]["runs"].items(), key=lambda x: int(x[0]))
                for b, rec in sorted(by.items(), key=lambda x: int(x[0]))]

    def _fixed(self, k: str) -> dict[str, Any]:
        n = self.networks[k]
        return {"hash": k, "ops": list(n["ops"]), "params": n["params"], "flops": n["flops"],
                "predicted": n.get("predicted"), "measured": n.get("measured")}

    def mean(self, arch: Architecture | str, metric: str = "val_acc",
             budget: int | None = None) -> float:
        """The metric's mean over the seeds at `budget` (not counted)."""
        k, b = self.key(arch), self._budget(budget)
        if metric not in METRICS:
            raise FbnasError(f"metric {metric!r}: one of {', '.join(METRICS)}")
        return statistics.fmean(float(by[str(b)][metric])
                                for by in self.networks[k]["runs"].values() if str(b) in by)

    def latency(self, arch: Architecture | str, which: str = "predicted") -> float:
        """The network's latency in the table's unit: `predicted` by the table or `measured`
        end to end at the build."""
        v = self.networks[self.key(arch)].get(which)
        if v is None:
            raise FbnasError(f"the benchmark has no {which} latency for {arch}")
        return float(v)

    def seed_tau(self, metric: str = "val_acc", budget: int | None = None,
                 keys: list[str] | None = None) -> float:
        """Kendall τ between the first two seeds' `metric` over the complete networks at
        `budget`: how well a second full training of every network reproduces the first's
        ranking, the yardstick for an estimator's τ against this benchmark (against the mean
        over seeds, an independent training would read somewhat higher; NaN with one
        seed). `keys`: over those networks only (a sampled benchmark's reference sample)."""
        from scipy.stats import kendalltau  # scipy.stats: 0.6 s, here only

        b = str(self._budget(budget))
        if len(self.seeds) < 2:
            return math.nan
        s0, s1 = (str(s) for s in self.seeds[:2])
        done = [self.networks[k]["runs"] for k in (self if keys is None else keys)
                if self.complete(k)]
        return float(kendalltau([float(r[s0][b][metric]) for r in done],
                                [float(r[s1][b][metric]) for r in done]).statistic)

    def front(self, metric: str = "val_acc", budget: int | None = None,
              latency: str = "predicted", keys: list[str] | None = None) -> list[str]:
        """The networks (of `keys`, default all) no other is both faster and better at (mean
        `metric`; a `_ce` metric counts lower as better), fastest first."""
        lower = metric.endswith("_ce") or metric.endswith("_loss")
        pts = sorted(((self.latency(k, latency), self.mean(k, metric, budget), k)
                      for k in (self if keys is None else keys) if self.complete(k)),
                     key=lambda t: (t[0], t[1] if lower else -t[1]))
        out, best = [], None
        for _, v, k in pts:
            if best is None or (v < best if lower else v > best):
                out.append(k)
                best = v
        return out


def check_space(b: Bench, cfg: Any, run: str | Path) -> None:
    """A one-line error unless benchmark `b` is of the space of `run` (config `cfg`)."""
    if b.space.macro != cfg.space.macro:
        raise FbnasError(f"{b.path}: a benchmark of space '{b.space.name}', not "
                         f"'{cfg.space.name}' ({run}'s space)")


def same_training(recorded: dict[str, Any], now: dict[str, Any]) -> bool:
    """Whether a file's training record is `now`'s; a file from before a retrain key existed
    (`retrain.threads`) lacks it and is compared on the keys it has."""
    if recorded.get("retrain", {}).keys() - now.get("retrain", {}).keys():
        return False
    kept = {**now, "retrain": {k: v for k, v in now.get("retrain", {}).items()
                               if k in recorded.get("retrain", {})}}
    return recorded == kept


def bench_for(path: str | Path, cfg: Any) -> Bench:
    """The benchmark at `path`, checked to be of `cfg`'s space and retrain recipe."""
    b = Bench.load(path)
    check_space(b, cfg, cfg.source)
    if not same_training(b.meta["training"], training_record(cfg)):
        raise FbnasError(f"{path}: trained with another data or retrain section than "
                         f"{cfg.source}; its records are not what this config would retrain")
    return b
