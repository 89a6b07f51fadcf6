"""Autoscaling: SLO evaluation with hysteresis, and scalers that change a model's worker count."""
