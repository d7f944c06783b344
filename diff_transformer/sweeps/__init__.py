"""Scaling sweeps: variants x sizes x token budgets, each point an ordinary training run;
`sweep.py` runs one, `fit.py` fits the power laws, `report.py` writes results.json and plots."""
