"""What a network costs: the kinds of cost (`kinds`: latency, FLOPs, params, their units and the
one way FLOPs are counted), and the cost of an architecture under a run's table (`model`:
`OpCosts`, `predicted_cost`; `widths`: `WidthCosts` for a width-searched space). Where a run's
table comes from (loaded, cached or measured) is `fbnas.fit.costs`; how a table's values are
calibrated is `fbnas.latency.table.calibrated`.

The package imports none of its modules, so `fbnas.costs.kinds` is read without torch.
"""
