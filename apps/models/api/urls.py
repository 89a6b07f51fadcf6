from django.urls import path

from apps.models.api import views

urlpatterns = [
    path("models", views.ModelList.as_view(), name="model-list"),
]
