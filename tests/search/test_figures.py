"""The search log names each figure for what it measures (issue 25): the argmax architecture
as a path of the supernet, the relaxed supernet in modes that compute every candidate, and
the final (fitted) architecture's path accuracy; history.json carries the same names."""

import copy
import json
import re

import pytest
from conftest import digits_run_config

from fbnas.config import config_from_dict
from fbnas.search._figures import FIGURES
from fbnas.trainer import SearchTrainer
from fbnas.training.logs import close_logger


@pytest.mark.parametrize("mode,relaxed", [("full", True), ("reinforce", False)])
def test_the_log_and_history_name_what_each_figure_measures(tmp_path, mode, relaxed):
    d = digits_run_config(search={"mode": mode, "weights": "shared"})
    d["run"]["dir"] = str(tmp_path / "run")
    t = SearchTrainer(config_from_dict(copy.deepcopy(d), "t.yaml"), tmp_path / "run")
    try:
        result = t.train()
    finally:
        close_logger(t.log)
    log = (tmp_path / "run" / "train.log").read_text()
    epochs = [ln for ln in log.splitlines() if re.search(r"epoch \d+/2 ", ln)]
    assert len(epochs) == 2
    for ln in epochs:
        assert re.search(r"argmax_path_acc \d\.\d{3}", ln), ln
        assert ("relaxed_acc" in ln) == relaxed, ln
        assert "val_acc" not in ln
    assert re.search(r"final architecture as a path of the supernet .*val acc \d\.\d{3}", log)
    assert 0.0 <= result["final_path_acc"] <= 1.0
    hist = json.loads((tmp_path / "run" / "history.json").read_text())
    for rec in hist:
        assert 0.0 <= rec["argmax_path_acc"] <= 1.0 and rec["argmax_path_ce"] > 0
        assert ("relaxed_acc" in rec) == relaxed
    # every figure the log line shows is described
    for name in ("w_ce", "w_acc", "argmax_path_acc", "relaxed_acc", "predicted"):
        assert name in FIGURES
