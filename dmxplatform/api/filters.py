"""Query filters of the management API's lists (django-filter): a value that does not parse is
a 400 naming the parameter."""

from __future__ import annotations

from copy import deepcopy
from datetime import UTC

import django_filters
from django import forms
from django.core.exceptions import ValidationError
from django.db import models
from django_filters.fields import IsoDateTimeField
from django_filters.rest_framework import FilterSet


class _TrueOrFalse(forms.TypedChoiceField):
    def __init__(self, **kwargs) -> None:
        kwargs.pop("empty_value", None)
        super().__init__(
            choices=[("true", "true"), ("false", "false")],
            coerce=lambda value: value == "true",
            empty_value=None,
            **kwargs,
        )


class BooleanFilter(django_filters.BooleanFilter):
    """`true` or `false`; anything else is a 400 (django-filter's own takes it for no filter,
    answering with rows the caller did not ask for)."""

    field_class = _TrueOrFalse


class _UtcMoment(IsoDateTimeField):
    def to_python(self, value):
        moment = super().to_python(value)
        if moment is None:
            return None
        # ISO 8601 allows offsets to ±23:59, PostgreSQL takes them to ±15:59 only: ask in UTC.
        try:
            return moment.astimezone(UTC)
        except OverflowError:  # 0001-01-01T00:00+01:00 is before the first UTC moment
            raise ValidationError("Out of range.", code="invalid") from None


class MomentFilter(django_filters.IsoDateTimeFilter):
    """An ISO 8601 moment, with any offset."""

    field_class = _UtcMoment


class ManagementFilterSet(FilterSet):
    """The base of every list's filters: booleans are strict."""

    FILTER_DEFAULTS = {
        **deepcopy(FilterSet.FILTER_DEFAULTS),
        models.BooleanField: {"filter_class": BooleanFilter},
        models.DateTimeField: {"filter_class": MomentFilter},
    }
