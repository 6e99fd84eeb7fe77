"""Experiments over the public functions: `ember compare`, the GLUE runner, the quickstart, sweeps
(Optuna) and their reports. They sit above ``ember.api`` and nothing below imports them."""
