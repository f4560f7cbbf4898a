"""Every script's documented default command, run on what ships (issue 38, item 5).

Each test runs `python -m scripts.NAME` from the repository root with the arguments of the
first command its module docstring (and scripts/README.md) shows, on the shipped configs, with
only its sizes cut down (epochs, rounds, samples, batch, networks; where a space's size is
the cost, the quickstart's config with its space cut to two layers, `small_quickstart`) through
the script's own flags or `--set`, and checks that it exits 0 and that its figures are printed
and parse.
tests/scripts/test_scripts.py runs the scripts on a tiny test config instead; these run what a
user runs. Slow: seconds to two minutes each on 2 cores; `python -m pytest -m slow -n 0
tests/scripts/test_default_commands.py`, about 22 minutes in all.

A script that compares checkouts (`--code DIR`) is given a `git worktree` of the old commit its
docstring names, removed after.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import SMALL_QUICKSTART

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?"
# a search's measured fit cut down: one network timed, among the 4 probes nearest its target
SMALL_FIT = ("--set", "search.fit_rounds=1", "--set", "search.fit_panel=4")


def run(name: str, *argv: str, timeout: int = 900, env: dict[str, str] | None = None,
        ok: tuple[int, ...] = (0,)) -> str:
    """`python -m scripts.NAME ARGV` from the repository root, one torch thread per process
    (the cores are shared); its stdout, its exit status asserted to be in `ok`."""
    r = subprocess.run([sys.executable, "-m", f"scripts.{name}", *argv], cwd=ROOT,
                       capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
    assert r.returncode in ok, (f"python -m scripts.{name} {' '.join(argv)}: exit "
                                f"{r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r.stdout


def line(out: str, pattern: str) -> re.Match:
    """The first line of `out` that matches `pattern` (re.search), as its match."""
    for ln in out.splitlines():
        m = re.search(pattern, ln)
        if m:
            return m
    raise AssertionError(f"no line matches {pattern!r} in:\n{out[-3000:]}")


def numbers(text: str) -> list[float]:
    """The numbers in `text`; a '-' right after a number is a range's dash, not a sign."""
    return [float(x) for x in re.findall(rf"(?<![\w.]){NUM}", text)]


@pytest.fixture(scope="module")
def table_cache(tmp_path_factory) -> str:
    """One latency-table cache for the tests that search the quickstart with its latency cost
    (the table is measured once, by the first of them), instead of ~/.cache/fbnas/tables."""
    return str(tmp_path_factory.mktemp("tables"))


@pytest.fixture(scope="module")
def small_quickstart(tmp_path_factory) -> str:
    """A config file of SMALL_QUICKSTART: for the scripts whose cost is timing or lowering
    every entry of a space's table, or timing its networks."""
    path = tmp_path_factory.mktemp("small") / "quickstart_small.yaml"
    path.write_text(SMALL_QUICKSTART, encoding="utf-8")
    return str(path)


@pytest.fixture
def worktree(tmp_path):
    """`worktree(commit)`: a detached git worktree of `commit` in tmp_path, removed after."""
    made: list[Path] = []

    def add(commit: str) -> Path:
        git = ["git", "-C", str(ROOT)]
        if subprocess.run([*git, "cat-file", "-e", f"{commit}^{{commit}}"],
                          capture_output=True).returncode:
            pytest.skip(f"needs the git history (commit {commit})")
        path = tmp_path / f"old-{commit}"
        subprocess.run([*git, "worktree", "add", "--detach", str(path), commit], check=True,
                       capture_output=True)
        made.append(path)
        return path

    yield add
    for path in made:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)],
                       capture_output=True)


# ---- the speed suite and its parts ----------------------------------------------------------
def test_bench(small_quickstart):
    # `python -m scripts.speed.suite`; --quick is its own "every part with tiny sizes", on the
    # small quickstart (the parts run on fbnet_cifar10 in their own tests below)
    out = run("speed.suite", "--quick", "--config", small_quickstart)
    for title in ("== 1. search modes", "== 2. data loader", "== 3. distributed",
                  "== 4. mixed precision"):
        assert title in out, title
    assert line(out, r"single_path speed-up over full:")
    for workers in (0, 2):
        m = line(out, rf"search weight loader, {workers} worker\(s\), image folder .*: "
                      rf"({NUM}) img/s.*loader / step = x({NUM})")
        assert float(m[1]) > 0 and float(m[2]) > 0
    assert line(out, r"θ-grad cos")


def test_bench_modes():
    # `python -m scripts.speed.modes`: fbnet_cifar10, every layer; batch and rounds cut
    out = run("speed.modes", "--batch", "2", "--repeats", "1", "--mem-samples", "1")
    assert "fbnet_cifar10, 22 searchable layers x 9 candidates, batch 2" in out
    for mode in ("single_path", "two_path"):
        m = line(out, rf"^{mode} speed-up over full:\s+({NUM})x\s+activation memory ({NUM}) "
                      "of full$")
        assert float(m[1]) > 0 and 0 < float(m[2]) < 1
    assert line(out, rf"^checkpointing \(full\+ckpt / full\): step time ({NUM})x")
    m = line(out, rf"^supernet overhead ratio .*: median ({NUM}) .*; 198 candidate blocks")
    assert float(m[1]) > 0


def test_bench_precision():
    # `python -m scripts.speed.precision`: fbnet_cifar10 cut to 8 layers; batch, rounds cut
    out = run("speed.precision", "--batch", "4", "--repeats", "1", "--steps", "1")
    assert "fbnet_cifar10-8layers" in out
    for variant in ("float32", "float32+channels_last", "bf16", "bf16+channels_last"):
        row = numbers(line(out, rf"^{re.escape(variant)}\s+{NUM} \[").string[len(variant):])
        # search ms [lo- hi] speed-up, child ms [lo- hi] speed-up, logits err, loss err, cos
        assert len(row) == 11 and row[3] > 0 and row[7] > 0 and -1 <= row[10] <= 1, row


def test_bench_ddp():
    # `OMP_NUM_THREADS=1 python -m scripts.speed.ddp`: 1 process; 2 processes, K = 1 and 4
    out = run("speed.ddp", "--steps", "4", "--warmup", "4", "--repeats", "1", "--batch", "8",
              "--samples", "512")
    rows = [numbers(ln) for ln in out.splitlines()[2:]]
    assert [r[:2] for r in rows] == [[1, 1], [2, 1], [2, 4]]
    # procs, sync_every, images/s, its min-max, step ms
    assert all(len(r) == 6 and r[2] > 0 for r in rows), rows


def test_bench_compile(tmp_path, small_quickstart):
    # `python -m scripts.speed.compile`: quickstart's all-ir_k5_e6 child (here the small
    # quickstart's: compiling is most of the time), inductor; 1 block of 1 step, batch 4;
    # inductor's cache in tmp_path
    out = run("speed.compile", "--config", small_quickstart, "--blocks", "1", "--steps", "1",
              "--batch", "4", env={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path)})
    m = line(out, rf"^compiled / eager throughput: median x({NUM})")
    assert float(m[1]) > 0
    assert float(line(out, rf"^compile time \(first two steps\): ({NUM}) s")[1]) > 0


def test_bench_gpu_on_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    # `python -m scripts.speed.gpu --device cuda`: fbnet_imagenet, every mode and precision;
    # batch 96 -> 8, 1 round of 1 step, a smaller copy for the bandwidth
    out = run("speed.gpu", "--device", "cuda", "--batch", "8", "--steps", "1", "--rounds", "1",
              "--copy-gib", "0.25")
    _check_bench_gpu(out, ["full", "two_path", "single_path"], ["float32", "bf16"], cuda=True)


def test_bench_gpu_default_config_on_the_cpu():
    # the same command with --device cpu: the shipped ImageNet config (data.classes: 100)
    # with synthetic data; single_path only (full on 224x224 takes minutes a step on a CPU)
    out = run("speed.gpu", "--device", "cpu", "--batch", "2", "--modes", "single_path",
              "--steps", "1", "--rounds", "1", "--copy-gib", "0.01")
    _check_bench_gpu(out, ["single_path"], ["float32", "bf16"], cuda=False)


def _check_bench_gpu(out: str, modes: list[str], precisions: list[str], cuda: bool) -> None:
    assert "configs/fbnet_imagenet.yaml: batch" in out
    assert line(out, r"^data.classes 100: the 100-output head .*space.num_classes=100")
    first = None
    for mode in modes:
        for p in precisions:
            # the layout each variant ran (channels_last: auto is NHWC on CUDA, NCHW on a CPU)
            name = f"{mode}, {p}" + (" + channels_last" if cuda else ", NCHW")
            m = line(out, rf"^{re.escape(name)}\s+({NUM}) \({NUM}-{NUM}\)\s+(\d+)\s+({NUM}|-)"
                          rf"\s+({NUM})\s+({NUM})\s+({NUM})\s+({NUM})$")
            assert float(m[1]) > 0 and float(m[4]) > 0 and float(m[6]) > 0
            assert (m[3] != "-") == cuda
            first = first or float(m[7])
    assert first == 1.0


def test_bench_search_epochs(worktree):
    # `git worktree add /tmp/base e4987fe` (before issue 14, and before search.mode: reinforce
    # in the quickstart), then `python -m scripts.speed.search_epochs --code /tmp/base --code .`;
    # 64 images of 8x8, batch 16, 2 epochs, 1 repeat
    old = worktree("e4987fe").resolve()
    out = run("speed.search_epochs", "--code", str(old), "--code", ".", "--size", "64",
              "--batch", "16", "--epochs", "2", "--repeats", "1", "--input-size", "8")
    assert "config: the space of" in out and "configs/quickstart.yaml" in out
    for code in (old, ROOT):
        assert line(out, rf"^repeat 1, {re.escape(str(code))} on \w+: θ epochs {NUM} s")
    rows = out.split("x first\n")[-1].splitlines()
    assert [r.split()[0] for r in rows] == [str(old), str(ROOT)]
    ratios = [numbers(r.split(None, 1)[1]) for r in rows]
    assert ratios[0][-1] == 1.0 and all(len(r) == 4 and r[0] > 0 for r in ratios), ratios


def test_compare_runs(worktree):
    # `git worktree add /tmp/base af3d295` (the commit before fbnas/ was regrouped: same
    # behaviour), then the docstring's command; 2 epochs of 64 digits. Exit 1 is its answer
    # "some mode differs" (a later change of the search's results, not of this script): then
    # each mode's line names the field; a checkout that cannot run prints no mode line
    old = worktree("af3d295")
    out = run("search.compare_runs", "--code", str(old), "--code", ".", "--config",
              "configs/quickstart.yaml", "--modes", "full,two_path", "--set",
              "latency.cost=flops", "--set", "search.epochs=2", "--set",
              "search.warmup_epochs=1", "--set", "data.limit=64", ok=(0, 1))
    assert line(out, r"configs/quickstart.yaml for every checkout; --set latency.cost=flops")
    got = {m: line(out, rf"^{m}: {re.escape(str(old))} vs \.: (.+)$")[1]
           for m in ("full", "two_path")}
    # identical when this was written (the regroup kept the behaviour)
    assert all(v == "identical" or re.match(r"\.\S+: ", v) for v in got.values()), got


def test_bench_search_quality(table_cache, small_quickstart):
    # `python -m scripts.search.quality weights --steps 600` (600 -> 5 steps), then
    # `... search --seeds 0,1,2 --modes reinforce,full --retrain 20` (seed 0, 2 epochs of 300
    # digits, 1 retrain epoch) on the small quickstart with its latency table, the networks
    # fitted onto the target by the table alone (the measured fit's timings are not what this
    # reads)
    out = run("search.quality", "weights", "--config", small_quickstart, "--steps", "5",
              "--set", "data.limit=300", "--set", f"latency.cache_dir={table_cache}")
    for weights in ("separate", "shared"):
        row = numbers(line(out, rf"^{weights}\s+{NUM}").string[len(weights):])
        assert len(row) == 6 and all(0 <= a <= 1 for a in row[1:]), row
    out = run("search.quality", "search", "--config", small_quickstart, "--seeds", "0",
              "--modes", "reinforce,full", "--retrain", "1", "--set", "search.epochs=2", "--set",
              "search.warmup_epochs=1",
              "--set", "data.limit=300", "--set", f"latency.cache_dir={table_cache}",
              "--set", "search.fit_measure=off")
    for mode in ("reinforce", "full"):
        m = line(out, rf"^{mode}\s+0\s+({NUM})\s+({NUM})\s+(\d+)\s+(True|False)\s+({NUM})\s+"
                      rf"({NUM})\s+({NUM})\s+({NUM})  \S")
        assert 0 <= float(m[1]) <= 1 and 0 <= float(m[6]) <= 1 and float(m[8]) > 0


def test_bench_target(table_cache, small_quickstart):
    # `python -m scripts.search.target` (3 modes x 3 targets x 3 seeds): one search (full,
    # 0.5x, seed 0) of 2 epochs on the small quickstart, 1 random network, 2 rounds per
    # re-measurement; the measured fit times one network among 4 probes (its timings were
    # most of this test's time)
    out = run("search.target", "--config", small_quickstart, "--modes", "full", "--targets",
              "0.5x", "--seeds", "0", "--epochs", "2", "--random", "1", "--rounds", "2", "--set",
              "search.warmup_epochs=1", "--set", "data.limit=300", "--set",
              f"latency.cache_dir={table_cache}", *SMALL_FIT)
    assert line(out, r"^== 1 searches in \d+ s; \d+ networks timed together")
    assert line(out, r"^  0.5x: \d+ architectures of the space predicted within ±3%")
    m = line(out, rf"^full\s+0.5x\s+({NUM})\s+0\s+({NUM})\s+(\S+)\s+\d+/\d+\s+({NUM})\s+"
                  rf"({NUM})%\s+({NUM})\s+({NUM})%")
    assert all(float(m[i]) > 0 for i in (1, 2, 4, 6))
    assert line(out, r"^re-measured at the end, all together: within ±3%: [01]/1")
    assert float(line(out, rf"^end run / right after, median over the networks: ({NUM})")[1]) > 0
    assert line(out, rf"^random architectures \(n=1\): measured {NUM}-{NUM} us")


def test_bench_regret(table_cache):
    # `python -m scripts.search.regret` (reinforce, shared, 3 seeds x 3 targets, on the shipped
    # benchmark): one search (seed 0, 0.5x) of 2 epochs on 300 digits, its τ over all 256
    out = run("search.regret", "--seeds", "0", "--targets", "0.5x", "--jobs", "1",
              "--set", "search.epochs=2", "--set", "search.warmup_epochs=1", "--set",
              "data.limit=300", "--set", f"latency.cache_dir={table_cache}")
    m = line(out, rf"^reinforce\s+shared\s+0\s+0.5x\s+({NUM})\s+({NUM})\s+({NUM})\s+({NUM})")
    assert 0 <= float(m[1]) <= 100 and 0 <= float(m[2]) <= 100 and -1 <= float(m[3]) <= 1
    # runs, median regret, top10, top10* (possible on the target), exh10, >rnd, median τ
    assert line(out, rf"^reinforce\s+shared\s+1\s+{NUM}\s+[01]\s+[01]\s+{NUM}\s+[01]\s+{NUM}")


def test_bench_reproduce():
    # `python -m scripts.search.reproduce --n 5 --seed 7`: one network, 2 retrain epochs
    out = run("search.reproduce", "--n", "1", "--seed", "7", "--set", "retrain.epochs=2",
              "--set", "retrain.warmup_epochs=0")
    assert line(out, rf"bench_digits.json.gz: seed-to-seed sd test {NUM} pt")
    assert line(out, r"^within 2 seed-sd \(test and val\): [01] of 1$")


def test_pilot_task(tmp_path):
    # `python -m scripts.search.pilot_task --config configs/cluttered_digits.yaml --workers 2
    # --at 0.3 --log /tmp/pilot.log --out /tmp/pilot.jsonl`: 2 networks, 2 seeds, 1 epoch, one
    # canvas per source
    log = tmp_path / "pilot.log"
    out = run("search.pilot_task", "--config", "configs/cluttered_digits.yaml", "--workers", "2",
              "--at", "0.3", "--log", str(log), "--out", str(tmp_path / "pilot.jsonl"),
              "--networks", "2", "--seeds", "0,1", "--set",
              "retrain.epochs=1", "--set", "retrain.warmup_epochs=0", "--set",
              "data.clutter_per_source=1")
    assert line(out, rf"band {NUM} MFLOPs ±3% holds \d+ networks, 2 drawn")
    assert line(out, rf"^p95 {NUM}, p80 {NUM}: gap {NUM} pt = {NUM} SE; best {NUM}%$")
    assert len(log.read_text().splitlines()) == 4


def test_bench_sweep(tmp_path, small_quickstart):
    # `python -m scripts.search.sweep` (targets 0.3x, 0.5x, 0.8x; 5 random; 15 retrain epochs):
    # the small quickstart, one target, 1 random network, 2 search epochs and 1 retrain epoch
    # on 300 digits, the measured fit as in test_bench_target; a fresh latency table in --out,
    # as the script does
    out = run("search.sweep", "--config", small_quickstart, "--values", "0.5x", "--random", "1",
              "--retrain-epochs", "1",
              "--set", "search.epochs=2", "--set", "search.warmup_epochs=1", "--set",
              "data.limit=300", *SMALL_FIT, "--out", str(tmp_path / "sweep"))
    assert line(out, r"^== fbnas sweep .*quickstart_small.yaml: target = 0.5x")
    m = line(out, r"^random architectures dominated by a searched one: (\d+)/(\d+)")
    assert int(m[2]) == 1 and int(m[1]) <= 1
    assert line(out, rf"^sweep wall time: ({NUM}) s")
    m = line(out, rf"^ref-all_k5_e6\s+reference\s+({NUM})\s+({NUM})\s+{NUM}%\s+{NUM}%\s+1\.00")
    assert float(m[1]) > 0 and float(m[2]) > 0


# ---- latency tables ----------------------------------------------------------------------
def test_bench_latency(tmp_path, small_quickstart):
    # `python -m scripts.latency.repeatability` (fbnet_cifar10 on the CPU) on the small
    # quickstart: 50 networks -> 4, 2 table rounds and validation rounds, 2 probes, 5 timeit
    # runs of the reference protocol; every step (build, reference protocol, validation,
    # rebuild) kept; the JSON in tmp_path
    out = run("latency.repeatability", "--config", small_quickstart, "--n-archs", "4",
              "--rounds", "2", "--val-rounds", "2", "--probes", "2", "--reference-runs", "5",
              "--out-dir", str(tmp_path))
    assert line(out, r"^== fbnas latency benchmark: quickstart_small, cpu, 1 thread\(s\), batch 1")
    assert line(out, rf"^build: {NUM} s for \d+ entries")
    assert line(out, rf"^rebuild: per-entry change median {NUM}% p90 {NUM}%")
    m = line(out, rf"^table:\s+Spearman ({NUM})\s+Kendall ({NUM})\s+median pred/meas ({NUM})"
                  rf"\s+MAPE ({NUM})%")
    assert -1 <= float(m[1]) <= 1 and float(m[3]) > 0
    assert line(out, rf"^reference protocol \(timeit x5, .*\): Spearman ({NUM}) Kendall")
    assert (tmp_path / "bench.json").is_file()


def test_bench_tables():
    # `python -m scripts.latency.tables`: every shipped space -> the quickstart's and CIFAR's
    # (ImageNet's 224x224 entries are most of the time), allocator retain; 1 build, 1 seed, 5
    # networks (validate's least), 2 rounds each, 2 context probes
    out = run("latency.tables", "--spaces", "quickstart,fbnet_cifar10", "--builds", "1",
              "--seeds", "0", "-n", "5", "--val-rounds", "2", "--rounds", "2", "--worst", "1",
              "--probes", "2")
    medians = out.split("== medians over builds and seeds")[1]
    for space in ("quickstart", "fbnet_cifar10"):
        m = line(out, rf"^{space}\s+retain\s+build 0 \(\s*\d+ s\) seed 0: table S ({NUM}) K "
                      rf"({NUM}) \| FLOPs S ({NUM}) \| pred/meas ({NUM}) MAPE\s+({NUM})%")
        assert -1 <= float(m[1]) <= 1 and float(m[4]) > 0
        assert line(medians, rf"^{space}\s+retain\s+table S {NUM} \[")


def test_bench_runtimes(small_quickstart):
    # `python -m scripts.latency.runtimes`: eager + ExecuTorch + ONNX Runtime; 20 networks -> 3,
    # 2 rounds, 12 context probes -> 2, and the small quickstart's space for fbnet_cifar10's:
    # lowering every entry and probe for ExecuTorch and ONNX Runtime is most of it, whatever
    # the sizes (CIFAR's 110 entries: about ten minutes on 2 cores; the quickstart's 44 about
    # four; these 8 under two)
    pytest.importorskip("executorch")
    pytest.importorskip("onnxruntime")
    out = run("latency.runtimes", "--space", small_quickstart, "-n", "3", "--val-rounds", "2",
              "--rounds", "2", "--probes", "2", timeout=3600)
    for rt in ("cpu", "executorch", "ort"):
        assert line(out, rf"^{rt}: table built in \d+ s")
        m = line(out, rf"^{rt}\s+\d+\s+{NUM}-{NUM}\s+({NUM})\s+({NUM})\s+({NUM})%\s+({NUM})%")
        assert -1 <= float(m[1]) <= 1 and float(m[3]) >= 0
    assert "S/K/MAPE" in out


def test_bench_reference():
    # `python -m scripts.latency.reference`: every block; 60 rounds -> 2, 2 repeats -> 1
    out = run("latency.reference", "--rounds", "2", "--repeats", "1")
    assert line(out, r"^== over 1 repeats x 8 blocks")
    for ref in ("raw", "compute", "res112", "res56", "stream"):
        m = line(out, rf"^{ref}\s+({NUM})% \[{NUM}-{NUM}\]\s+least (\d+)$")
        assert float(m[1]) >= 0


# ---- other tools ---------------------------------------------------------------------------
def test_bench_export():
    # `python -m scripts.latency.export`: quickstart, every format; 5 archs -> 1, 64 inputs -> 2
    pytest.importorskip("onnxruntime")
    pytest.importorskip("executorch")
    out = run("latency.export", "--n-archs", "1", "--inputs", "2")
    for fmt in ("torchscript", "onnx", "pt2", "pte"):
        m = line(out, rf"^{fmt}\s+max abs diff: median ({NUM})\s+max ({NUM})\s+max rel diff: "
                      rf"median ({NUM})\s+max ({NUM}).*all ok: (True|False)\)$")
        assert m[5] == "True", m.string


def test_theta_signal():
    # `python -m scripts.search.theta_signal`: the quickstart; 100 warm-up steps -> 1, 50 draws -> 1
    pytest.importorskip("sklearn")
    out = run("search.theta_signal", "--warm-steps", "1", "--draws", "1", "--batch", "8")
    assert "configs/quickstart.yaml: 6 layers" in out
    for mode in ("full", "single_path", "two_path"):
        row = re.sub(r"\(.*?\)", "", line(out, rf"^  {mode}\s").string)
        assert len(numbers(row)) == 6, row
