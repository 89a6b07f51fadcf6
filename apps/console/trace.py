"""The request trace: find a request by its id, key or time; see which layer it spent its time in.

Two admin pages (registered in dmxplatform.admin): a search over the usage records, and one
request's waterfall of gateway stages, its routing decision and its usage record, with a link
to its spans in the tracing UI (DMX_TRACE_URL), where the engine's own span is.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from urllib.parse import quote

from django import forms
from django.conf import settings
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone

from apps.billing.choices import UsageStatus
from apps.billing.models import UsageRecord
from apps.billing.selectors import usage_record_find, usage_records_search
from apps.console.waterfall import Bar, waterfall
from apps.keys.models import KEY_PREFIX
from apps.routing.selectors import routing_decision_find

# Requests per page of results: a screen or two of rows, one cheap query.
PAGE_SIZE = 50
# Pages are an offset into the newest first; past this many the offset scan costs more than a
# narrower search (a time range, a key) would.
MAX_PAGE = 200
# A search without criteria: the last hour's requests, not the whole usage table.
DEFAULT_RANGE = timedelta(hours=1)
# Where DMX_TRACE_URL takes the trace id.
TRACE_ID_PLACEHOLDER = "{trace_id}"
# What the pages show; a viewer (apps/keys/migrations/0005) has both.
VIEW_USAGE = "billing.view_usagerecord"
VIEW_DECISIONS = "routing.view_routingdecision"


class TraceSearchForm(forms.Form):
    request_id = forms.CharField(label="Request id", required=False, max_length=64)
    client_request_id = forms.CharField(label="Client request id", required=False, max_length=128)
    key_prefix = forms.CharField(
        label="Key prefix", required=False, max_length=64, help_text="e.g. sk-dmx-abcd1234"
    )
    tenant = forms.CharField(required=False, max_length=128, help_text="Slug or name.")
    model = forms.CharField(required=False, max_length=128)
    status = forms.ChoiceField(choices=[("", "any"), *UsageStatus.choices], required=False)
    since = forms.DateTimeField(
        label="From (UTC)",
        required=False,
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
    )
    until = forms.DateTimeField(
        label="Until (UTC)",
        required=False,
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
    )

    def clean_key_prefix(self) -> str:
        """The key's public id, or its first characters, from its prefix as the portal and the
        admin show it (`sk-dmx-abcd1234_…`): only the id part, so that a pasted whole secret
        never reaches a query."""
        shown = self.cleaned_data["key_prefix"].strip()
        return shown.removeprefix(KEY_PREFIX).partition("_")[0].rstrip("…")


def _require(request: HttpRequest, permission: str) -> None:
    if not request.user.has_perm(permission):
        raise PermissionDenied


@dataclass(frozen=True, slots=True)
class ResultPage:
    """One page of results; whether an older one follows is known from one row more, so that
    no page counts the usage table."""

    number: int
    rows: list[tuple[UsageRecord, Bar | None]]
    has_next: bool

    @property
    def has_previous(self) -> bool:
        return self.number > 1

    @property
    def previous_page_number(self) -> int:
        return self.number - 1

    @property
    def next_page_number(self) -> int:
        return self.number + 1


def _page_number(value: str | None) -> int:
    try:
        number = int(value or 1)
    except ValueError:
        return 1
    return min(max(number, 1), MAX_PAGE)


def _result_page(records: QuerySet[UsageRecord], number: int) -> ResultPage:
    start = (number - 1) * PAGE_SIZE
    found = list(records[start : start + PAGE_SIZE + 1])
    return ResultPage(
        number=number,
        rows=[
            (record, waterfall(timings=record.timings, duration_ms=record.duration_ms).slowest)
            for record in found[:PAGE_SIZE]
        ],
        has_next=len(found) > PAGE_SIZE and number < MAX_PAGE,
    )


def trace_search_view(request: HttpRequest) -> HttpResponse:
    """Requests matching the form, newest first, each with its duration and slowest stage; a
    request id that matches goes straight to its trace. Without criteria, the last hour's."""
    _require(request, VIEW_USAGE)
    form = TraceSearchForm(request.GET or None)
    page, default_since = None, None
    if not form.is_bound or form.is_valid():
        given = form.cleaned_data if form.is_bound else {}
        criteria = {name: value for name, value in given.items() if value}
        if not criteria:
            default_since = timezone.now() - DEFAULT_RANGE
            criteria["since"] = default_since
        if "key_prefix" in criteria:
            criteria["key_id"] = criteria.pop("key_prefix")
        records = usage_records_search(**criteria)
        request_id = criteria.get("request_id")
        if request_id and records.exists():
            return HttpResponseRedirect(reverse("admin:console_trace", args=[request_id]))
        page = _result_page(records, _page_number(request.GET.get("page")))
    context = {
        **admin.site.each_context(request),
        "title": "Request traces",
        "form": form,
        "page": page,
        "rows": page.rows if page else [],
        "default_since": default_since,
    }
    return TemplateResponse(request, "admin/console/trace_search.html", context)


def trace_detail_view(request: HttpRequest, request_id: str) -> HttpResponse:
    """One request: its stages as a waterfall, its routing decision, its usage record."""
    _require(request, VIEW_USAGE)
    record = usage_record_find(request_id=request_id)
    if record is None:
        raise Http404("no usage record with this request id (yet: records arrive within seconds)")
    may_see_decision = request.user.has_perm(VIEW_DECISIONS)
    trace_url = ""
    if record.trace_id and settings.DMX_TRACE_URL:
        # Not str.format: a URL's other braces (a Grafana query's JSON) are no placeholders.
        trace_url = settings.DMX_TRACE_URL.replace(
            TRACE_ID_PLACEHOLDER, quote(record.trace_id, safe="")
        )
    context = {
        **admin.site.each_context(request),
        "title": f"Request {record.request_id}",
        "record": record,
        "waterfall": waterfall(timings=record.timings, duration_ms=record.duration_ms),
        "may_see_decision": may_see_decision,
        "decision": routing_decision_find(request_id=request_id) if may_see_decision else None,
        "trace_url": trace_url,
    }
    return TemplateResponse(request, "admin/console/trace_detail.html", context)
