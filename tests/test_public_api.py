"""The public API: the names `fbnas.__all__` lists, imported from `fbnas` itself, each from its
module when first asked for (so `import fbnas` imports no torch), and the docs' Python samples
import from it alone."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

import fbnas

ROOT = Path(__file__).parents[1]


def test_import_fbnas_imports_no_torch():
    # nor does reading the cost kinds through the lazy `fbnas.latency` (the CLI's help does)
    out = subprocess.run([sys.executable, "-c", "import sys, fbnas; fbnas.FbnasError; "
                          "from fbnas.latency.kinds import COST_KINDS; COST_KINDS.choices(); "
                          "print('torch' in sys.modules)"], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize("name", [n for n in fbnas.__all__ if n != "__version__"])
def test_every_public_name_is_its_modules_object(name):
    obj = getattr(fbnas, name)
    home = fbnas._PUBLIC.get(name)
    if home is not None:
        import importlib

        assert obj is getattr(importlib.import_module(home), name)
    assert name in dir(fbnas)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nosuch'"):
        fbnas.nosuch  # noqa: B018


def test_the_docs_python_samples_import_from_fbnas_alone():
    deep = []
    for md in sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]:
        for block in re.findall(r"```python\n(.*?)```", md.read_text(), re.S):
            deep += [f"{md.name}: {m}" for m in re.findall(r"^from fbnas\.\S+ import .*$",
                                                          block, re.M)]
    assert deep == []


def test_the_latency_package_names_resolve_lazily_to_their_modules():
    """`fbnas.latency` re-exports its modules' names without importing them up front (so the
    cost kinds are read without torch: the first test above); each name is the object its
    module defines."""
    import importlib

    import fbnas.latency as latency

    # a name that is also a submodule's would read as the module once that is imported
    submodules = {f.stem for f in Path(latency.__file__).parent.glob("*.py")}
    assert not submodules & set(latency.__all__)
    for name in latency.__all__:
        assert getattr(latency, name) is getattr(
            importlib.import_module(latency._NAMES[name]), name), name
    with pytest.raises(AttributeError, match="no attribute 'nosuch'"):
        latency.nosuch  # noqa: B018
