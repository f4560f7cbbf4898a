"""`fbnas --help`, `--version`, every command's and action's `--help` and every argparse error
return without importing torch or any trainer: each command module imports its work when it
runs, and the registries the flags list (timers, formats, cost kinds) are declared by name."""

import json
import subprocess
import sys

CHECK = r"""
import argparse, contextlib, io, json, sys
from fbnas._cli import build_parser, main

def walk(parser, path):
    yield path, parser
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sp in a.choices.items():
                yield from walk(sp, path + [name])

helps = {" ".join(path): sp.format_help() for path, sp in walk(build_parser(), [])}
codes = {}
for argv in (["--version"], ["--help"], ["train", "--help"], ["latency", "build", "--help"],
             ["nosuch"], ["train", "--nosuch"], ["latency", "build"], ["bench", "duel", "--x"],
             ["export", "--help"], ["runs", "--help"]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
        except SystemExit as e:
            codes[" ".join(argv)] = (e.code, err.getvalue())
heavy = [m for m in ("torch", "numpy", "scipy", "fbnas.trainer", "fbnas.supernet", "fbnas.config",
                     "fbnas.arch", "fbnas.latency.table", "fbnas.latency.build")
         if m in sys.modules]
print(json.dumps({"helps": helps, "codes": codes, "heavy": heavy}))
"""


def _run() -> dict:
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    return json.loads(out.splitlines()[-1])


def test_help_and_argparse_errors_import_no_torch_and_no_trainer():
    r = _run()
    assert r["heavy"] == [], r["heavy"]
    helps = r["helps"]
    assert len(helps) >= 25  # fbnas, every command, every latency and bench action
    assert "latency build" in helps and "bench duel" in helps and "train" in helps
    # the choices the registries declare are listed without importing them
    assert "cpu" in helps["latency build"] and "thread" in helps["latency build"]
    assert "onnx" in helps["export"]
    # a test-only timer is accepted but not offered
    assert "fake" not in helps["latency build"]
    codes = r["codes"]
    assert codes["--version"][0] == 0 and codes["train --help"][0] == 0
    for argv in ("nosuch", "train --nosuch", "latency build", "bench duel --x"):
        assert codes[argv][0] == 2, (argv, codes[argv])
