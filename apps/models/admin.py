from django.contrib import admin
from django.http import HttpRequest

from apps.models.models import LlmModel, ModelVersion, Tokenizer
from apps.models.services import (
    llm_model_delete,
    llm_model_save,
    model_version_delete,
    model_version_save,
    tokenizer_delete,
)
from dmxplatform.admin import ReadOnlyAdminMixin, ServiceDeletesMixin


class ModelVersionWrites(ServiceDeletesMixin):
    """For an admin of versions (this app's, routing's of canaries): every change goes through
    the services, which tell the gateways to rebuild their catalog."""

    def save_model(self, request: HttpRequest, obj: ModelVersion, form, change: bool) -> None:
        model_version_save(version=obj)

    def delete_row(self, obj: ModelVersion) -> None:
        model_version_delete(version=obj)


class ModelVersionInline(admin.TabularInline):
    model = ModelVersion
    extra = 0
    fields = ["tag", "source", "tokenizer", "is_active", "created_at"]
    readonly_fields = ["tokenizer", "created_at"]


@admin.register(LlmModel)
class LlmModelAdmin(ServiceDeletesMixin, admin.ModelAdmin):
    """Every change goes through a service, which tells the gateways to rebuild their catalog."""

    list_display = ["name", "kind", "max_context_tokens", "owned_by", "is_active", "created_at"]
    list_filter = ["kind", "is_active"]
    search_fields = ["name"]
    inlines = [ModelVersionInline]

    def save_model(self, request: HttpRequest, obj: LlmModel, form, change: bool) -> None:
        llm_model_save(model=obj)

    def save_formset(self, request: HttpRequest, form, formset, change: bool) -> None:
        # The versions the inline added, changed or removed, each through the services.
        versions = formset.save(commit=False)
        for version in formset.deleted_objects:
            model_version_delete(version=version)
        for version in versions:
            model_version_save(version=version)
        formset.save_m2m()

    def delete_row(self, obj: LlmModel) -> None:
        llm_model_delete(model=obj)


@admin.register(ModelVersion)
class ModelVersionAdmin(ModelVersionWrites, admin.ModelAdmin):
    list_display = ["__str__", "source", "tokenizer", "is_active", "created_at"]
    list_filter = ["model", "is_active"]


@admin.register(Tokenizer)
class TokenizerAdmin(ReadOnlyAdminMixin, ServiceDeletesMixin, admin.ModelAdmin):
    list_display = ["sha256", "bos_token", "eos_token", "created_at"]
    readonly_fields = ["sha256", "tokenizer_json", "chat_template", "bos_token", "eos_token"]
    console_refuses = ("add",)  # workers upload tokenizers; see inference/wire.py

    def delete_row(self, obj: Tokenizer) -> None:
        tokenizer_delete(tokenizer=obj)
