"""Hyperparameter tuning as a cluster service (Hydro): surrogate models, fused trials, trials in pipeline bubbles."""
