"""A run directory and what is read from it: the names of its files (`files`), a retrain's
results.json and its one schema (`results`), the index of results behind `fbnas runs`
(`index`), and a finished or interrupted search opened as one object (`search_run`)."""
