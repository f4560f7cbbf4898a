import runpy
import sys
from pathlib import Path

import pytest

from fbnas._cli import main

ROOT = Path(__file__).parents[2]


def test_space_command(capsys):
    assert main(["space", str(ROOT / "configs/fbnet_cifar10.yaml")]) == 0
    out = capsys.readouterr().out
    assert "22 searchable layers" in out and "352" in out


def test_arch_command(capsys):
    assert main(["arch", str(ROOT / "configs/archs/fbnet_c.yaml"),
                 "--config", str(ROOT / "configs/fbnet_imagenet.yaml")]) == 0
    out = capsys.readouterr().out
    assert "fbnet_c" in out and "params 5.57 M" in out


def test_errors_are_one_line_with_status_2(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("space: [1, 2")
    assert main(["space", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and str(bad) in err and "malformed YAML" in err


def test_arch_not_in_space_exit_2(capsys):
    rc = main(["arch", str(ROOT / "configs/archs/fbnet_a.yaml"),
               "--config", str(ROOT / "configs/fbnet_cifar10.yaml")])
    assert rc == 2
    assert "macro.input_size" in capsys.readouterr().err


def test_unknown_command_is_argparse_error():
    with pytest.raises(SystemExit) as e:
        main(["frobnicate"])
    assert e.value.code == 2


def test_python_m_fbnas_runs_the_cli(monkeypatch, capsys):
    """`python -m fbnas ARGS` (fbnas/__main__.py) is `fbnas ARGS`, its status the exit code."""
    monkeypatch.setattr(sys, "argv", ["fbnas", "space", str(ROOT / "configs/fbnet_cifar10.yaml")])
    with pytest.raises(SystemExit) as e:
        runpy.run_module("fbnas", run_name="__main__")
    assert e.value.code == 0 and "22 searchable layers" in capsys.readouterr().out


@pytest.mark.parametrize("argv, usage", [
    (["space", "c.yaml", "--nosuch"], "usage: fbnas space"),
    (["latency", "build", "--config", "c.yaml", "--table", "t.json", "--zz"],
     "usage: fbnas latency build"),
    (["bench", "show", "--bench", "b.json.gz", "--nosuch", "1"], "usage: fbnas bench show"),
])
def test_an_unknown_flag_is_reported_against_its_commands_usage(argv, usage, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith(usage), err
    assert f"{usage.removeprefix('usage: ')}: error: unrecognized arguments: " in err, err


def test_a_bad_choice_fails_before_anything_is_printed(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["bench", "show", "--bench", str(ROOT / "configs/bench_digits.json.gz"),
              "--metric", "nosuch"])
    out, err = capsys.readouterr()
    assert out == "" and "--metric: invalid choice: 'nosuch'" in err


@pytest.mark.parametrize("message, said", [
    ("fbnas sweep --workers 2 needs Ray: pip install 'fbnas[ray]'",
     "fbnas sweep: error: --workers 2 needs Ray: pip install 'fbnas[ray]'"),
    ("sweep: parameter must be one of alpha", "fbnas sweep: error: parameter must be one of alpha"),
    ("runs/x: no such file", "fbnas sweep: error: runs/x: no such file"),
])
def test_the_command_is_named_once(message, said, monkeypatch, capsys):
    from fbnas._cli import sweep
    from fbnas.errors import FbnasError

    def fail(args):
        raise FbnasError(message)

    monkeypatch.setattr(sweep, "run", fail)
    assert main(["sweep", "--config", "c.yaml", "--beta", "0,1"]) == 2
    assert capsys.readouterr().err.strip() == said
