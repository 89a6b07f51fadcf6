"""Admin for scaling policies and their events (imported by apps.routing.admin)."""
