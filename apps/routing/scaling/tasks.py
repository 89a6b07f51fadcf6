"""Celery tasks of autoscaling."""
