from django.contrib import admin
from django.http import HttpRequest

from apps.models.models import LlmModel, ModelVersion, Tokenizer
from apps.models.services import catalog_invalidate


class CatalogAdmin(admin.ModelAdmin):
    """Every change to the registry tells the gateways to rebuild their catalog."""

    def save_model(self, request: HttpRequest, obj, form, change: bool) -> None:
        obj.full_clean()
        super().save_model(request, obj, form, change)
        catalog_invalidate()

    def delete_model(self, request: HttpRequest, obj) -> None:
        super().delete_model(request, obj)
        catalog_invalidate()


class ModelVersionInline(admin.TabularInline):
    model = ModelVersion
    extra = 0
    fields = ["tag", "source", "tokenizer", "is_active", "created_at"]
    readonly_fields = ["tokenizer", "created_at"]


@admin.register(LlmModel)
class LlmModelAdmin(CatalogAdmin):
    list_display = ["name", "max_context_tokens", "owned_by", "is_active", "created_at"]
    search_fields = ["name"]
    inlines = [ModelVersionInline]

    def save_related(self, request: HttpRequest, form, formsets, change: bool) -> None:
        super().save_related(request, form, formsets, change)
        catalog_invalidate()


@admin.register(ModelVersion)
class ModelVersionAdmin(CatalogAdmin):
    list_display = ["__str__", "source", "tokenizer", "is_active", "created_at"]
    list_filter = ["model", "is_active"]


@admin.register(Tokenizer)
class TokenizerAdmin(admin.ModelAdmin):
    list_display = ["sha256", "bos_token", "eos_token", "created_at"]
    readonly_fields = ["sha256", "tokenizer_json", "chat_template", "bos_token", "eos_token"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # workers upload tokenizers; see inference/wire.py
