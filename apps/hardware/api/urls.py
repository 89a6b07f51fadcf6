from django.urls import path

from apps.hardware.api import views

urlpatterns = [
    path("nodes/register", views.NodeRegisterView.as_view(), name="node-register"),
    path("tokenizers/<str:sha256>", views.TokenizerUploadView.as_view(), name="tokenizer-upload"),
    # `path`: a model's name may hold a slash (inference.wire.ENGINE_SETTINGS_PATH).
    path(
        "models/<path:model>/versions/<path:version>/engine",
        views.EngineSettingsView.as_view(),
        name="engine-settings",
    ),
]
