"""The shipped configs: found by name from any folder, listed and copied by `fbnas configs`,
and declared as package data so a plain install carries them."""

import fnmatch
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fbnas._cli import main
from fbnas.io import config_file, shipped_configs

ROOT = Path(__file__).parents[2]


def test_every_file_under_configs_is_shipped_package_data():
    text = (ROOT / "pyproject.toml").read_text()
    block = re.search(r"\[tool\.setuptools\.package-data\]\s*fbnas = \[([^\]]*)\]", text)
    assert block, "pyproject.toml declares no package data for fbnas"
    patterns = re.findall(r'"([^"]+)"', block.group(1))
    files = [p.relative_to(ROOT) for p in (ROOT / "configs").rglob("*") if p.is_file()]
    assert files
    for f in files:
        assert any(fnmatch.fnmatch(str(f), pat) for pat in patterns), f
    # the package's configs folder is the top-level one
    assert (ROOT / "fbnas/configs").resolve() == (ROOT / "configs").resolve()


def test_configs_lists_every_shipped_config_with_its_summary(capsys):
    assert main(["configs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    names = [ln.split()[0] for ln in lines]
    assert names == sorted(p.stem for p in (ROOT / "configs").glob("*.yaml"))
    assert all(len(ln.split(None, 1)) == 2 for ln in lines)  # every one has a summary
    assert any(ln.startswith("quickstart ") and "digits" in ln for ln in lines)


def test_configs_copy_writes_the_shipped_text_and_refuses_to_overwrite(tmp_path, capsys):
    dest = tmp_path / "mine.yaml"
    assert main(["configs", "copy", "quickstart", str(dest)]) == 0
    assert dest.read_text() == (ROOT / "configs/quickstart.yaml").read_text()
    dest.write_text("edited")
    assert main(["configs", "copy", "quickstart", str(dest)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fbnas configs copy: error: ") and "--force" in err
    assert dest.read_text() == "edited"
    assert main(["configs", "copy", "quickstart.yaml", str(dest), "--force"]) == 0
    assert dest.read_text().startswith("# Quickstart")
    assert main(["configs", "copy", "nosuch", str(tmp_path / "x.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert "no shipped config 'nosuch'" in err and "quickstart" in err and "\n" not in err
    assert not (tmp_path / "x.yaml").exists()


def test_a_config_is_found_by_name_from_any_folder_and_a_file_wins(tmp_path, monkeypatch,
                                                                  capsys):
    monkeypatch.chdir(tmp_path)
    assert Path(config_file("quickstart")) == shipped_configs()["quickstart"]
    assert main(["space", "quickstart"]) == 0
    assert "search space 'quickstart'" in capsys.readouterr().out
    (tmp_path / "quickstart").write_text("space: {}")  # a file of that name is that file
    assert config_file("quickstart") == "quickstart"


def test_an_unknown_config_is_one_line_naming_it_and_train_without_one_says_how(
        tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--config", "quickstrat"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fbnas train: error: quickstrat: no such file, and no shipped config")
    assert "quickstart" in err and "\n" not in err
    assert main(["space", "nosuch.yaml"]) == 2
    assert "nosuch.yaml: no such file" in capsys.readouterr().err
    assert main(["train"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fbnas train: error: ") and "--config quickstart" in err


@pytest.mark.slow
def test_a_built_wheel_carries_the_configs(tmp_path):
    """`pip wheel .` (what a plain `pip install .` installs) holds every shipped config. Built
    from a copy of the checkout (links kept), so that the build's folders stay out of it."""
    import shutil
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", "build", "dist", "runs", "*.egg-info", "__pycache__", ".venv", ".*_cache"))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                        str(tmp_path), str(src)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    import zipfile
    (wheel,) = tmp_path.glob("fbnas-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for p in (ROOT / "configs").rglob("*"):
        if p.is_file():
            assert f"fbnas/{p.relative_to(ROOT)}" in names, p
