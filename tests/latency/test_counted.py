"""FLOPs and params tables (fbnas/latency/counted.py): counted, not timed, and equal to the
child network's counts."""

from __future__ import annotations

import pytest

from fbnas.arch import arch_from_indices, build_child, count_flops, count_params, module_flops
from fbnas.latency import LatencyTable, build_cost_table

from .fakes import tiny_space


@pytest.mark.parametrize("cost", ["flops", "params"])
def test_counted_tables_match_the_child_network(cost, tmp_path):
    space = tiny_space(candidates=["ir_k3_e1", "ir_k5_e3_se", "ir_k3_e1_g2", "skip"])
    table = build_cost_table(space, cost)
    table.save(tmp_path / f"{cost}.json")
    table = LatencyTable.load(tmp_path / f"{cost}.json")
    assert table.unit == cost and table.meta["backend"] == "none"
    arch = arch_from_indices(space, [i % 4 for i in range(space.num_layers)])
    net = build_child(arch)
    want = count_flops(net, (8, 8)) if cost == "flops" else count_params(net)
    if cost == "flops":  # the fake timer's count, on the meta device
        assert module_flops(net.eval().to("meta"), (3, 8, 8), "meta") == want
    assert table.predict(arch) == pytest.approx(want)
    table.check_run(batch=64, dtype="bfloat16")  # counted tables fit any run
    rows, fixed = table.costs_for(space)
    assert fixed > 0 and rows[0]["skip"] == 0.0
