from apps.routing.scaling import admin as scaling_admin  # noqa: F401  (registers its models)
