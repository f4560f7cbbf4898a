"""Latency tables for a device that cannot run fbnas: `fbnas latency bundle` and `import`.

`write_bundle` lowers every block signature of a space (stem and head included) that a table
lacks, the reference op, an empty program (the runtime's per-call overhead) and the context
probe networks to ExecuTorch/XNNPACK `.pte` programs, and writes them with `manifest.json` and
a standalone `run_bundle.py` (needs Python, torch and executorch, not fbnas) into one folder.
Copy the folder to the device, run `python run_bundle.py`, copy `results.json` back, and
`import_results` turns it into a normal latency table: the same drift-compensated ratios,
reference scale, call-overhead correction and context model as `fbnas latency build`, with
the device's own description in the table's meta.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fbnas.arch import Architecture, build_child
from fbnas.backends import TIMERS
from fbnas.backends.executorch import ExecuTorchTimer, lower_executorch
from fbnas.backends.exported import calibration_inputs
from fbnas.errors import FbnasError
from fbnas.io import write_json_atomic
from fbnas.latency.build import (
    OVERHEAD,
    _context_from,
    _record_noise,
    entry_stats,
    probe_archs,
    refresh_values,
)
from fbnas.latency.measure import REFERENCE, EntryStats, Protocol, reference_scale
from fbnas.latency.signature import Signature, space_signatures
from fbnas.latency.table import LatencyTable
from fbnas.search_space import SearchSpace
from fbnas.settings import CONTEXT_PROBES

RUNTIMES = TIMERS.choices(bundle=True)
RUNNER = Path(__file__).with_name("bundle_runner.py")


def write_bundle(space: SearchSpace, out: str | Path, runtime: str = "executorch",
                 threads: int = 1, protocol: Protocol | None = None, probes: int = CONTEXT_PROBES,
                 table: LatencyTable | None = None, log=None,
                 networks: Sequence[Architecture] = (), purpose: dict | None = None,
                 quantization: str | None = None) -> dict[str, Any]:
    """Write the bundle folder `out` (see module docstring); returns the manifest. `networks`
    are whole architectures to time as well (kind `network`: `fbnas sample --near-target`),
    and `purpose` is recorded in the manifest as it is (what the bundle is for).
    `quantization` (`int8`): every program quantized as `latency.quantization: int8` times
    it on this machine (the same calibration inputs and quantizer), recorded in the manifest
    so that the import builds an int8 table; by default `table`'s, else `none`."""
    if runtime not in RUNTIMES:
        raise FbnasError(f"--runtime: {runtime!r} is not bundled (choose from "
                         f"{', '.join(RUNTIMES)})")
    have = table.setting("quantization") if table is not None else "none"
    quantization = quantization or have
    if quantization not in ExecuTorchTimer.quantizations:
        raise FbnasError(f"--quantization: {quantization!r} is not bundled (choose from "
                         f"{', '.join(ExecuTorchTimer.quantizations)})")
    if table is not None and quantization != have:
        raise FbnasError(f"--table: its entries are timed with quantization {have!r}, the "
                         f"bundle's programs {quantization!r}; give a table of the same "
                         "quantization, or none")
    version = ExecuTorchTimer.require()
    log = log or (lambda s: None)
    p = protocol or Protocol()
    out = Path(out)
    if (out / "manifest.json").exists():
        raise FbnasError(f"{out}: holds a bundle already; write a new one to an empty folder")
    sigs = [s for s in space_signatures(space) if table is None or s not in table]
    arches = probe_archs(space, probes) if probes > 0 else []
    staging = out.with_name(f".{out.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "programs").mkdir(parents=True)
    programs: list[dict[str, Any]] = []

    def add(key: str, module: nn.Module, chw, **extra) -> None:
        torch.manual_seed(0)
        x = torch.randn(1, *chw)
        calibration = calibration_inputs(x) if quantization != "none" else None
        buf, info = lower_executorch(module.eval(), x, where=key, int8_calibration=calibration)
        name = hashlib.sha256(key.encode()).hexdigest()[:16] + ".pte"
        (staging / "programs" / name).write_bytes(buf)
        programs.append({"key": key, "file": f"programs/{name}", "input_shape": [1, *chw],
                         "delegated": info["delegated"], **extra})

    try:
        add(REFERENCE.key(), REFERENCE.build(), REFERENCE.input_shape, kind="reference")
        add(OVERHEAD, nn.Identity(), REFERENCE.input_shape, kind="overhead")
        for i, sig in enumerate(sigs):
            add(sig.key(), sig.build(), sig.input_shape, kind="entry", sig=sig.to_dict())
            log(f"lowered {i + 1}/{len(sigs)} {sig.key()}")
        for a in arches:
            add(f"probe {a.name}", build_child(a), (a.macro.in_channels, *a.macro.input_size),
                kind="probe", arch=a.to_dict())
        for a in networks:
            torch.manual_seed(0)
            add(f"network {a.name}", build_child(a), (a.macro.in_channels, *a.macro.input_size),
                kind="network", arch=a.to_dict())
        manifest = {
            "schema": 1, "space": space.name, "runtime": runtime, "runtime_version": version,
            "torch_version": torch.__version__, "threads": threads, "batch": 1,
            "dtype": "float32", "reference": REFERENCE.key(), "rounds": p.rounds,
            "sample_s": p.sample_s, "ref_sample_s": p.ref_sample_s, "seed": p.seed,
            "programs": programs, **({"purpose": purpose} if purpose else {}),
            # only where quantized: an fp32 bundle's manifest (and its id) as before
            **({} if quantization == "none" else {"quantization": quantization}),
        }
        manifest["bundle_id"] = hashlib.sha256(
            json.dumps(manifest, sort_keys=True).encode()).hexdigest()[:16]
        write_json_atomic(staging / "manifest.json", manifest)
        shutil.copyfile(RUNNER, staging / "run_bundle.py")
        if out.exists():
            if any(out.iterdir()):
                raise FbnasError(f"{out}: is not empty; write the bundle to a new folder")
            out.rmdir()
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log(f"{out}: {len(sigs)} entries + {len(arches)} probes + {len(networks)} networks as .pte, "
        "manifest.json, run_bundle.py")
    return manifest


def read_results(results_path: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(results, manifest) of a bundle run: `results.json` with its `manifest.json` beside
    it, checked to belong together."""
    path = Path(results_path)
    try:
        res = json.loads(path.read_text())
        man = json.loads((path.parent / "manifest.json").read_text())
    except FileNotFoundError as e:
        raise FbnasError(f"{e.filename}: no such file (a bundle's results.json is read with "
                         "the bundle's manifest.json beside it)") from None
    except ValueError as e:
        raise FbnasError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(res, dict) or not isinstance(man, dict):
        raise FbnasError(f"{path}: not a bundle's results (a JSON object with its manifest)")
    if res.get("bundle") != man.get("bundle_id"):
        raise FbnasError(f"{path}: results of bundle {res.get('bundle')!r}, but the manifest "
                         f"beside it is bundle {man.get('bundle_id')!r}")
    return res, man


def network_latencies_us(res: dict[str, Any], man: dict[str, Any]
                         ) -> dict[str, tuple[Architecture, float, float]]:
    """The whole networks a bundle timed (kind `network`): name -> (architecture, median µs,
    IQR / median), in the device's own reference-op scale (as an imported table's µs)."""
    scale_us = reference_scale(res["ref_times_s"]) * 1e6
    out = {}
    for item in man["programs"]:
        if item.get("kind") != "network":
            continue
        a = Architecture.from_dict(item["arch"], item["key"])
        e = res["entries"].get(item["key"])
        if e is None:
            raise FbnasError(f"results.json: no timings for {item['key']!r}; run the whole "
                             "bundle")
        st = EntryStats(ratios=list(e["ratios"]))
        out[a.name] = (a, st.quantiles()[1] * scale_us, st.rel_iqr)
    return out


def import_results(results_path: str | Path, space: SearchSpace | None = None) -> LatencyTable:
    """A latency table from a bundle's `results.json` (its manifest beside it)."""
    path = Path(results_path)
    folder = path.parent
    res, man = read_results(path)
    items = {p["key"]: p for p in man["programs"]}
    missing = [k for k in items if k != man["reference"] and k not in res["entries"]]
    if missing:
        raise FbnasError(f"{path}: no timings for {len(missing)} program(s), e.g. "
                         f"{missing[0]!r}; run the whole bundle")
    dev = res["device"]
    meta = {"backend": man["runtime"], "device_name":
            f"{dev.get('cpu_model', 'unknown')} ({man['runtime']} "
            f"{dev.get('executorch_version', '?')})",
            "cpu_model": dev.get("cpu_model"), "threads": res["threads"], "batch": man["batch"],
            "dtype": man["dtype"], "memory_format": "contiguous",
            "mode": "exported (torch.export), inference", "runtime": man["runtime"],
            "runtime_version": dev.get("executorch_version"), "clock": res.get("clock"),
            "torch_version": dev.get("torch_version"), "device": dev,
            "imported_from": str(path), "bundle": man["bundle_id"],
            **({"quantization": man["quantization"]} if man.get("quantization", "none")
               != "none" else {})}
    table = LatencyTable("latency", meta)
    table.protocol = {"rounds": res["rounds"], "sample_s": man["sample_s"],
                      "ref_sample_s": man["ref_sample_s"], "ref_every": 2,
                      "reference_signature": man["reference"], "runner": "run_bundle.py"}
    scale_s = reference_scale(res["ref_times_s"])
    table.reference = {"signature": man["reference"], "scale_us": scale_s * 1e6,
                       "statistic": "p5 of reference samples"}

    def stats_of(key: str) -> EntryStats:
        e = res["entries"][key]
        return EntryStats(times=list(e["times_s"]), ratios=list(e["ratios"]),
                          number=int(e["calls"]))

    call = stats_of(OVERHEAD).quantiles()[1] if OVERHEAD in res["entries"] else 0.0
    probes: list[Architecture] = []
    for key, item in items.items():
        if item["kind"] == "entry":
            sig = Signature.from_dict(item["sig"], f"{folder / 'manifest.json'}: {key}")
            stats = entry_stats(sig, stats_of(key), scale_s, call)
            stats["delegated"] = item["delegated"]
            table.add(sig, 0.0, stats)
        elif item["kind"] == "probe":
            probes.append(Architecture.from_dict(item["arch"], key))
    if probes:
        _context_from(table, probes, {a.name: res["entries"][f"probe {a.name}"]["ratios"]
                                      for a in probes})
    refresh_values(table)
    _record_noise(table, res["ref_times_s"], 0, res.get("seconds") or 0.0, None)
    table.noise.pop("_ref_times_s")  # kept only while a build resumes
    if space is not None:
        lacking = [s.key() for s in space_signatures(space) if s not in table]
        if lacking:
            raise FbnasError(f"{path}: the bundle lacks {len(lacking)} entries of space "
                             f"{space.name!r}, e.g. {lacking[0]!r}")
    return table
