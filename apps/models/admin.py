from django import forms
from django.contrib import admin
from django.http import HttpRequest

from apps.models.engine_settings import REASONING_PARSERS, TOOL_CALL_PARSERS
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


def _parser_choices(names: tuple[str, ...]) -> list[tuple[str, str]]:
    return [("", "none"), *((name, name) for name in names)]


class ModelVersionForm(forms.ModelForm):
    """The engine's parsers picked from vLLM's (the model's clean() checks them again)."""

    class Meta:
        model = ModelVersion
        fields = "__all__"
        widgets = {
            "tool_call_parser": forms.Select(choices=_parser_choices(TOOL_CALL_PARSERS)),
            "reasoning_parser": forms.Select(choices=_parser_choices(REASONING_PARSERS)),
            "chat_template": forms.Textarea(attrs={"rows": 12, "class": "vLargeTextField"}),
        }


class ModelVersionInline(admin.TabularInline):
    model = ModelVersion
    form = ModelVersionForm
    extra = 0
    fields = [
        "tag",
        "source",
        "tokenizer",
        "tool_call_parser",
        "reasoning_parser",
        "is_active",
        "created_at",
    ]
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
    form = ModelVersionForm
    list_display = [
        "__str__",
        "source",
        "tokenizer",
        "tool_call_parser",
        "reasoning_parser",
        "is_active",
        "created_at",
    ]
    list_filter = ["model", "is_active"]


@admin.register(Tokenizer)
class TokenizerAdmin(ReadOnlyAdminMixin, ServiceDeletesMixin, admin.ModelAdmin):
    list_display = ["sha256", "bos_token", "eos_token", "created_at"]
    readonly_fields = ["sha256", "tokenizer_json", "chat_template", "bos_token", "eos_token"]
    console_refuses = ("add",)  # workers upload tokenizers; see inference/wire.py

    def delete_row(self, obj: Tokenizer) -> None:
        tokenizer_delete(tokenizer=obj)
