"""A run directory and what is read from it: the names of its files (`files`), a retrain's
results.json and its one schema (`results`), the index of results behind `fbnas runs`
(`index`), and which code wrote them (`provenance`). A finished search opened as one object
is `fbnas.fit.search_run` (it reads the search's config, table and supernet, which sit above
this package)."""
