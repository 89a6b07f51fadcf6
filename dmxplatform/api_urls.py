"""The management REST API, /api/v1/: each app's resources (its api/urls.py), one schema."""

urlpatterns: list = []
