"""The memory allocator a table is timed under: recorded, checked on load, run in a worker
process; and `fbnas latency measure --model` for any TorchScript file or .pt2 program."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import torch
from conftest import latency_space
from torch import nn

from fbnas.backends import allocator as alloc
from fbnas.backends.worker import call_in_worker, reused_workers
from fbnas.errors import FbnasError
from fbnas.latency import LatencyTable, Protocol, build_table, make_timer, measure_archs
from fbnas.latency.build import sample_spanning
from fbnas.latency.timed_models import ModelSpec, measure_specs, parse_input_shape
from fbnas.search_space import SearchSpace

FAST = Protocol(rounds=4, extra_rounds=0)
SPACE = SearchSpace.from_dict(latency_space())


def _env_of_worker() -> dict:
    return {k: os.environ.get(k) for k in (*alloc.RETAIN_ENV, alloc.WORKER_ENV)}


@pytest.mark.slow
def test_a_worker_runs_under_the_allocator_environment_and_returns_the_result():
    got = call_in_worker("retain", None, _env_of_worker, (), {})
    assert got == {**alloc.RETAIN_ENV, alloc.WORKER_ENV: "retain"}
    assert os.environ.get(alloc.WORKER_ENV) is None  # the parent is left as it was
    assert all(os.environ.get(k) != v for k, v in alloc.RETAIN_ENV.items())


def _fails():
    raise FbnasError("space.yaml: stages: bad")


@pytest.mark.slow
def test_a_worker_error_comes_back_as_the_same_one_line_error():
    with pytest.raises(FbnasError, match="space.yaml: stages: bad"):
        call_in_worker("retain", None, _fails, (), {})


def _fails_once() -> int:
    """Fails on a worker's first call, then returns its pid (_CALLS lives in the worker)."""
    _CALLS.append(1)
    if len(_CALLS) == 1:
        raise FbnasError("first call fails")
    return os.getpid()


_CALLS: list = []


@pytest.mark.slow
def test_reused_workers_serve_every_call_from_one_process_and_end_with_the_block():
    pids = [call_in_worker("retain", None, os.getpid, (), {}) for _ in range(2)]
    assert pids[0] != pids[1] and os.getpid() not in pids  # outside: a process per call
    with reused_workers():
        with pytest.raises(FbnasError, match="first call fails"):
            call_in_worker("retain", None, _fails_once, (), {})
        inside = [call_in_worker("retain", None, _fails_once, (), {}) for _ in range(2)]
        with reused_workers():  # nested: the outer block's worker
            inside.append(call_in_worker("retain", None, os.getpid, (), {}))
        assert inside[0] == inside[1] == inside[2]  # the worker that failed still serves
        env = call_in_worker("retain", None, _env_of_worker, (), {})
        assert env == {**alloc.RETAIN_ENV, alloc.WORKER_ENV: "retain"}
    assert not _alive(inside[0]), "the kept worker outlived its block"
    assert call_in_worker("retain", None, os.getpid, (), {}) != inside[0]


def _children(pid: int) -> list[int]:
    """Live (not zombie) processes whose parent is `pid`, from /proc."""
    out = []
    for d in os.listdir("/proc"):
        try:
            stat = open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if stat[0] != "Z" and int(stat[1]) == pid:
            out.append(int(d))
    return out


def _alive(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads processes from /proc")
def test_a_worker_ends_when_its_parent_is_killed_outright():
    code = ("import time; from fbnas.backends.worker import call_in_worker; "
            "call_in_worker('retain', None, time.sleep, (120,), {})")
    parent = subprocess.Popen([sys.executable, "-c", code])
    try:
        workers: list[int] = []
        for _ in range(300):  # the spawned worker (and multiprocessing's resource tracker)
            workers = [p for p in _children(parent.pid)
                       if b"spawn_main" in open(f"/proc/{p}/cmdline", "rb").read()]
            if workers:
                break
            time.sleep(0.1)
        assert workers, "the worker process never started"
        parent.kill()  # SIGKILL: no atexit, no multiprocessing cleanup
        parent.wait()
        for _ in range(100):
            if not any(_alive(p) for p in workers):
                break
            time.sleep(0.1)
        assert not any(_alive(p) for p in workers), "the worker outlived its parent by 10 s"
    finally:
        if parent.poll() is None:
            parent.kill()


@pytest.mark.slow
def test_worker_timer_gives_the_in_process_numbers_for_the_fake_backend():
    here = build_table(SPACE, make_timer("fake", noise=0.02, seed=3), FAST, context_probes=2)
    lines = []
    there = build_table(SPACE, make_timer("fake", noise=0.02, seed=3, allocator="retain"),
                        FAST, context_probes=2, log=lines.append)
    assert here.meta["allocator"] == "system" and there.meta["allocator"] == "retain"
    assert there.meta["allocator_env"] == alloc.RETAIN_ENV
    assert len(there) == len(here) > 5
    for k, e in here.entries.items():
        assert there.entries[k].value == pytest.approx(e.value, rel=1e-12)
    assert any("context model" in s for s in lines)  # log lines come back from the worker
    archs = sample_spanning(SPACE, 4, here.costs_for(SPACE, "raw")[0])
    a = measure_archs(make_timer("fake", seed=5), archs, FAST)
    b = measure_archs(make_timer("fake", seed=5, allocator="retain"), archs, FAST)
    assert [a.ratio(x.name) for x in archs] == pytest.approx([b.ratio(x.name) for x in archs])


@pytest.mark.slow  # moved from the fast tier: 4-6 s, its module has other fast tests
def test_the_allocator_is_checked_when_a_table_is_used_or_extended(tmp_path):
    t = build_table(SPACE, make_timer("fake"), FAST, context_probes=0)
    t.check_run(allocator="system")
    with pytest.raises(FbnasError, match=r"meta.allocator is 'system' .* --allocator retain"):
        t.check_run(allocator="retain")
    with pytest.raises(FbnasError, match="meta.allocator is 'system' but this build"):
        build_table(SPACE, make_timer("fake", allocator="retain"), FAST, table=t)
    # a table written before the setting existed was measured under the system allocator
    del t.meta["allocator"]
    t.save(tmp_path / "old.json")
    LatencyTable.load(tmp_path / "old.json").check_run(allocator="system")


def test_unknown_or_missing_allocators_are_one_line_errors(monkeypatch):
    with pytest.raises(FbnasError, match="unknown allocator 'hoard'; choose one of system, "
                                         "retain, jemalloc, tcmalloc"):
        alloc.resolve("hoard", "latency.allocator")
    monkeypatch.setattr(alloc, "find_library", lambda kind: None)
    with pytest.raises(FbnasError, match=r"latency.allocator: jemalloc is not installed .*"
                                         "apt install libjemalloc2"):
        alloc.resolve("jemalloc", "latency.allocator")
    with pytest.raises(FbnasError, match="not a jemalloc or tcmalloc library"):
        alloc.resolve("/no/such/libjemalloc.so.2")
    with pytest.raises(FbnasError, match="applies to the cpu backend"):
        make_timer("cuda", allocator="retain")


def test_cpu_timers_default_to_retain_and_record_it():
    t = make_timer("cpu")
    assert t.allocator == alloc.DEFAULT == "retain"
    d = t.describe()
    assert d["allocator"] == "retain" and d["allocator_env"]["MALLOC_TRIM_THRESHOLD_"]
    assert make_timer("cpu", allocator="system").describe()["allocator"] == "system"


def test_config_allocator_key_is_checked(tmp_path):
    from fbnas.config import config_from_dict

    base = {"space": latency_space(), "latency": {"device": "cpu", "allocator": "nope"}}
    with pytest.raises(FbnasError, match="latency: allocator: unknown allocator 'nope'"):
        config_from_dict(base, "c.yaml")
    base["latency"] = {"device": "cuda", "allocator": "retain"}
    with pytest.raises(FbnasError, match="c.yaml: latency: allocator: 'retain' applies to "
                                         "device cpu only"):
        config_from_dict(base, "c.yaml")
    base["latency"] = {"device": "fake", "allocator": "retain"}
    assert config_from_dict(base, "c.yaml").latency.make_timer().allocator == "retain"


# ---- any model -------------------------------------------------------------------------------
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        return self.fc(self.conv(x).mean((2, 3)))


def _files(tmp_path):
    torch.manual_seed(0)
    net = Net().eval()
    x = torch.randn(1, 3, 12, 12)
    ts = tmp_path / "plain.pt"
    torch.jit.trace(net, x).save(str(ts))
    pt2 = tmp_path / "net.pt2"
    torch.export.save(torch.export.export(net, (x,)), str(pt2))
    return ts, pt2


def test_input_shape_parsing():
    assert parse_input_shape("3,224,224") == (3, 224, 224)
    assert parse_input_shape("1x28x28") == (1, 28, 28)
    assert parse_input_shape(None) is None
    for bad in ("3,224", "a,b,c", "3,0,4", "3,2,2,2"):
        with pytest.raises(FbnasError, match="--input-shape: expected C,H,W"):
            parse_input_shape(bad)


@pytest.mark.slow  # scripting and exporting the two programs (torch.export's first use in a
# worker is 2 s); the fast tier times arch networks through the same measure_specs
def test_plain_torchscript_and_pt2_programs_are_timed_with_arch_networks(tmp_path):
    ts, pt2 = _files(tmp_path)
    specs = [ModelSpec("0:plain", "model", str(ts), (3, 12, 12)),
             ModelSpec("1:net", "model", str(pt2))]
    info, m = measure_specs(make_timer("fake"), specs, FAST)
    assert [i["input_shape"] for i in info] == [[3, 12, 12], [3, 12, 12]]
    assert [i["hash"] for i in info] == [None, None]
    assert m.entries["0:plain"].n == m.entries["1:net"].n == FAST.rounds  # same rounds
    assert m.ratio("0:plain") > 0 and m.ratio("1:net") > 0
    with pytest.raises(FbnasError, match="plain.pt: a TorchScript model without an fbnas "
                                         "architecture inside; give its input shape"):
        measure_specs(make_timer("fake"), [ModelSpec("0", "model", str(ts))], FAST)
    with pytest.raises(FbnasError, match=r"net.pt2: exported for input \(3, 12, 12\), not "
                                         "--input-shape 3,16,16"):
        measure_specs(make_timer("fake"), [ModelSpec("0", "model", str(pt2), (3, 16, 16))],
                      FAST)
    with pytest.raises(FbnasError, match="net.pt2: exported for batch 1, but the timer's "
                                         "batch is 2"):
        measure_specs(make_timer("fake", batch=2), [ModelSpec("0", "model", str(pt2))], FAST)


@pytest.mark.slow
def test_cli_measure_times_a_pt2_and_torchscript_beside_an_arch(tmp_path, capsys):
    ts, pt2 = _files(tmp_path)
    out = tmp_path / "m.json"
    cmd = [sys.executable, "-m", "fbnas", "latency", "measure", "--device", "fake",
           "--model", str(ts), str(pt2), "--input-shape", "3,12,12", "--rounds", "3",
           "--allocator", "retain", "--json", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert [x["model"] for x in res["results"]] == [str(ts), str(pt2)]
    assert res["timer"]["allocator"] == "retain"
    assert "retain allocator" in r.stdout
    bad = subprocess.run(cmd[:-2] + ["--input-shape", "3,12"], capture_output=True,
                         text=True, timeout=300)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0
    assert "--input-shape: expected C,H,W" in bad.stderr


def test_cli_refuses_an_unknown_or_absent_allocator_and_writes_nothing(tmp_path, capsys,
                                                                         monkeypatch):
    import yaml

    from fbnas._cli import main

    cfg = tmp_path / "space.yaml"
    cfg.write_text(yaml.safe_dump({"space": latency_space()}))
    out = tmp_path / "t.json"
    base = ["latency", "build", "--config", str(cfg), "--table", str(out), "--quiet"]
    assert main([*base, "--allocator", "hoard"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "unknown allocator 'hoard'" in err
    monkeypatch.setattr(alloc, "find_library", lambda kind: None)
    assert main([*base, "--allocator", "tcmalloc"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "tcmalloc is not installed" in err
    assert not out.exists()
    # a table built under one allocator is refused for validation under another
    assert main([*base, "--device", "fake", "--probes", "0", "--rounds", "3"]) == 0
    assert LatencyTable.load(out).meta["allocator"] == "system"
    assert main(["latency", "validate", "--config", str(cfg), "--table", str(out), "-n", "5",
                 "--device", "fake", "--allocator", "retain", "--rounds", "3"]) == 2
    assert "meta.allocator is 'system' but this run asks for 'retain'" in capsys.readouterr().err
