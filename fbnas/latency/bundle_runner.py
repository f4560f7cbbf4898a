"""Times an fbnas latency bundle on a device that cannot run fbnas (copied into the bundle as
`run_bundle.py`; needs only Python, `torch` and `executorch`, not fbnas).

    python run_bundle.py [BUNDLE_DIR] [--rounds N]

Reads BUNDLE_DIR/manifest.json, loads every `.pte` program, and times them in interleaved,
shuffled rounds with the bundle's reference op sampled between every two programs (each sample
divided by the mean of the reference samples around it, as `fbnas latency build` does), with
ExecuTorch's threadpool and torch's thread count set to the manifest's `threads`. Writes
BUNDLE_DIR/results.json (atomically), which `fbnas latency import` turns into a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def main(argv: list[str]) -> int:
    import torch
    from executorch.extension.pybindings import portable_lib
    from executorch.runtime import Runtime, Verification

    ap = argparse.ArgumentParser(description="time an fbnas latency bundle")
    ap.add_argument("folder", nargs="?", default=str(Path(__file__).resolve().parent))
    ap.add_argument("--rounds", type=int, default=None)
    args = ap.parse_args(argv)
    folder = Path(args.folder)
    man = json.loads((folder / "manifest.json").read_text())
    rounds = args.rounds or int(man["rounds"])
    threads = int(man["threads"])
    portable_lib._unsafe_reset_threadpool(threads)  # before any program loads
    torch.set_num_threads(threads)
    runtime = Runtime.get()
    loaded = {}
    for item in man["programs"]:
        program = runtime.load_program((folder / item["file"]).read_bytes(),
                                       verification=Verification.Minimal)
        method = program.load_method("forward")
        x = torch.randn(item["input_shape"], generator=torch.Generator().manual_seed(0))
        inputs = [x] if method.metadata.num_inputs() == 1 else []
        loaded[item["key"]] = (program, method, inputs)

    clock = time.thread_time if threads == 1 and hasattr(time, "thread_time") else time.perf_counter

    def sample(key: str, number: int) -> float:
        method, inputs = loaded[key][1], loaded[key][2]
        t0 = clock()
        for _ in range(number):
            method.execute(inputs)
        return (clock() - t0) / number

    def calls_for(key: str, target_s: float) -> int:
        best = min(sample(key, 1) for _ in range(5))
        return max(1, min(100_000, round(target_s / max(best, 1e-9))))

    ref = man["reference"]
    keys = [k for k in loaded if k != ref]
    number = {k: calls_for(k, man["sample_s"]) for k in loaded}
    ref_n = calls_for(ref, man["ref_sample_s"])
    number[ref] = ref_n
    ref_times: list[float] = []
    ratios: dict[str, list[float]] = {k: [] for k in keys}
    times: dict[str, list[float]] = {k: [] for k in keys}
    rng = random.Random(man.get("seed", 0))
    started = time.time()
    for r in range(rounds):
        order = keys[:]
        rng.shuffle(order)
        before = sample(ref, ref_n)
        ref_times.append(before)
        for i in range(0, len(order), 2):
            got = [(k, sample(k, number[k])) for k in order[i:i + 2]]
            after = sample(ref, ref_n)
            ref_times.append(after)
            for k, t in got:
                times[k].append(t)
                ratios[k].append(t / (0.5 * (before + after)))
            before = after
        print(f"round {r + 1}/{rounds}", file=sys.stderr, flush=True)
    import executorch

    results = {
        "schema": 1, "bundle": man["bundle_id"], "rounds": rounds, "threads": threads,
        "clock": "thread" if clock is not time.perf_counter else "wall",
        "device": {"cpu_model": _cpu_name(), "machine": platform.machine(),
                   "system": f"{platform.system()} {platform.release()}",
                   "python": platform.python_version(),
                   "executorch_version": getattr(executorch, "__version__", "unknown"),
                   "torch_version": torch.__version__},
        "seconds": round(time.time() - started, 1), "ref_times_s": ref_times,
        "entries": {k: {"ratios": ratios[k], "times_s": times[k], "calls": number[k]}
                    for k in keys},
    }
    out = folder / "results.json"
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".results.")
    with os.fdopen(fd, "w") as f:
        json.dump(results, f)
    os.replace(tmp, out)
    print(f"{out}: {len(keys)} programs, {rounds} rounds, {results['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
