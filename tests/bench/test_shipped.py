"""Every shipped benchmark stays true (issue 51): one entry of each `configs/*.json.gz`,
retrained by `fbnas retrain` with the benchmark's config (`configs/<name>.yaml`) under the
entry's seed, reads the recorded figures to the last digit. A change to the child's numerics,
or a file built otherwise than a user retrains, fails here: then rebuild the file with the
command in its config's header. The retrain runs as the file's machine trained: torch's CPU
capability (AVX2, AVX512) changes the last digits, so a host of a higher one is held to the
file's (fbnas.bench.build.capability_env); a host of a lower one cannot check the file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fbnas.bench.build import capability_env, machine
from fbnas.bench.table import Bench, bench_for
from fbnas.config import load_config
from fbnas.runs.provenance import describe_code

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
SHIPPED = sorted(CONFIGS.glob("*.json.gz"))


def _config(path: Path) -> Path:
    return path.with_name(path.name.removesuffix(".json.gz") + ".yaml")


def test_every_shipped_benchmark_is_of_the_config_beside_it():
    """Each file loads against its config (the same space, data and retrain sections), so
    `fbnas retrain --config` of that config is what the file's records claim to be."""
    assert SHIPPED
    for path in SHIPPED:
        assert _config(path).is_file(), path
        b = bench_for(path, load_config(str(_config(path)), []))
        assert b.networks and all(b.complete(k) for k in b), path
        # and it says which kernels trained it, to a capability a host can be held to
        cap = recorded_capability(b)
        assert cap == "AVX512" or capability_env(cap, "AVX512"), path


def entry_to_retrain(b: Bench) -> tuple[str, int]:
    """The (network, seed) whose full-budget training was shortest among the networks that
    use every candidate op but skip (so that each block's numerics is exercised)."""
    full = str(b.budgets[-1])
    ops = {op for c in b.space.layer_candidates() for op in c} - {"skip"}
    done = [k for k in b if b.complete(k)]
    every = [k for k in done if ops <= set(b.networks[k]["ops"])] or done
    return min(((k, s) for k in every for s in b.seeds),
               key=lambda ks: b.networks[ks[0]]["runs"][str(ks[1])][full]["seconds"])


def sittings(b: Bench) -> list[dict]:
    """The machine of each sitting that trained `b` (the first, then those of its `code`)."""
    return [b.meta["machine"], *(c.get("machine", {}) for c in b.meta.get("code", []))]


def recorded_capability(b: Bench) -> str:
    """The CPU capability every sitting of `b` trained with (one, or the file is mixed)."""
    caps = {m.get("cpu_capability") for m in sittings(b)}
    assert len(caps) == 1 and None not in caps, f"{b.path}: trained with capabilities {caps}"
    return caps.pop()


def cpu_vendor(model: str | None) -> str:
    """AMD, Intel or the model as recorded (`machine()["cpu_model"]`)."""
    text = model or "an unrecorded CPU"
    return next((v for v in ("AMD", "Intel") if v.lower() in text.lower()), text)


def recorded_vendor(b: Bench) -> str:
    """The CPU vendor every sitting of `b` trained on (one, or the file is mixed). A sitting
    that recorded no CPU model predates that field (before 2026-11-30), when the project VM
    always ran on AMD EPYC hosts."""
    vendors = {cpu_vendor(m.get("cpu_model") or "AMD EPYC") for m in sittings(b)}
    assert len(vendors) == 1, f"{b.path}: trained on {vendors}"
    return vendors.pop()


def test_cpu_vendors_are_read_from_the_recorded_model():
    assert cpu_vendor("AMD EPYC 7B13") == "AMD" and cpu_vendor("AMD EPYC") == "AMD"
    assert cpu_vendor("Intel(R) Xeon(R) Processor @ 2.80GHz") == "Intel"
    assert cpu_vendor("Apple M2") == "Apple M2" and cpu_vendor(None) == "an unrecorded CPU"


@pytest.mark.slow
@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_a_shipped_entry_retrains_to_its_records(path, tmp_path):
    config = _config(path)
    b = bench_for(path, load_config(str(config), []))  # its space and training
    cap = recorded_capability(b)
    env = capability_env(cap)
    if env is None:
        pytest.skip(f"{path.name} was trained by {cap} kernels; this host's torch dispatches "
                    f"{machine()['cpu_capability']}, which cannot be held to them")
    theirs, ours = recorded_vendor(b), cpu_vendor(machine().get("cpu_model"))
    if theirs != ours:  # seen 2026-11-30: AMD-trained files on an Intel AVX512 host
        pytest.skip(f"{path.name} was trained on {theirs} CPUs; this host's is {ours}, whose "
                    "math libraries choose other kernels at the same capability")
    k, seed = entry_to_retrain(b)
    rec = b.networks[k]["runs"][str(seed)][str(b.budgets[-1])]
    arch, run = tmp_path / "arch.yaml", tmp_path / "run"
    b.arch(k).save(arch)
    r = subprocess.run([sys.executable, "-m", "fbnas", "retrain", "--config", str(config),
                        "--arch", str(arch), "--out", str(run), "--set", f"retrain.seed={seed}",
                        "--set", "retrain.measure_latency=false", "--set", "run.progress=false",
                        "--set", "run.tensorboard=false"], cwd=ROOT, capture_output=True,
                       text=True, env={**os.environ, **env}, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((run / "results.json").read_text())
    last = json.loads((run / "history.json").read_text())[-1]
    got = {"test_acc": res["top1"], "test_ce": res["test_ce"], "val_acc": res["val_top1"],
           "val_ce": res["val_ce"], "train_loss": last["train_loss"],
           "train_acc": last["train_acc"]}
    want = {m: rec[m] for m in got}
    built = describe_code(b.code[0]) if b.code else "an unrecorded commit"
    m = b.meta["machine"]
    assert got == want, (f"{path.name}: network {k[:12]} seed {seed} (built at {built} on "
                         f"{m.get('cpu_model', '?')} {cap}, {m['platform']}; here {machine()}, "
                         f"held to it by {env}) retrains to {got}, the file records {want}")
