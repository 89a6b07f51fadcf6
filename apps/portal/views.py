"""The developer portal's pages: thin views over the keys and billing apps' services and
selectors.

Every page acts in the tenant `tenancy.member_required` finds; objects are looked up within it
(another tenant's are a 404), and owner-only actions are refused to members (403) once found.
Secrets (a new or rotated key, a new management token) are rendered in the response to the
POST that made them, never stored, and marked not to be cached.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.http import FileResponse, Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.cache import add_never_cache_headers
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from apps.batches import selectors as batch_selectors
from apps.billing import selectors as billing_selectors
from apps.billing import services as billing_services
from apps.billing.choices import BillingMode, MovementKind
from apps.billing.models import BillingAccount
from apps.gateway.selectors import stored_responses_usage
from apps.keys import selectors, services
from apps.keys.choices import MemberRole
from apps.keys.models import KEY_PREFIX, ApiKey
from apps.keys.selectors import SESSION_TENANT
from apps.models.choices import ModelKind
from apps.models.selectors import llm_models_active
from apps.portal.forms import (
    BillingAlertsForm,
    BudgetForm,
    InviteForm,
    KeyCreateForm,
    KeyRotateForm,
    RedeemForm,
    RoleForm,
    StatementForm,
    TenantSwitchForm,
    TokenCreateForm,
    UsageExportForm,
)
from apps.portal.statements import statement_csv, statement_totals
from apps.portal.templatetags.money import money_text
from apps.portal.tenancy import current_membership, member_required, require_owner
from apps.portal.usage_csv import usage_csv_lines
from dmxplatform.errors import NotFoundError

# The usage page's window: the charts and the table by key cover the last 30 UTC days.
USAGE_DAYS = 30
# Balance movements per page of the billing page: a month of daily top-ups and redemptions
# fits one page; usage charges (one per request) page on.
MOVEMENTS_PER_PAGE = 25


def _form_status(form) -> int:
    return 400 if form.is_bound and form.errors else 200


def _secret_response(request: HttpRequest, template: str, context: dict) -> HttpResponse:
    response = render(request, template, context)
    add_never_cache_headers(response)  # the back button must not bring a secret back
    return response


@login_required
def home(request: HttpRequest) -> HttpResponse:
    return redirect("portal:keys")


@login_required
@require_POST
def tenant_switch(request: HttpRequest) -> HttpResponse:
    """Act in another of the user's tenants; a tenant that is not theirs is not found."""
    form = TenantSwitchForm(request.POST)
    if not form.is_valid():
        return HttpResponse("Choose a tenant.", status=400)
    membership = get_object_or_404(
        selectors.memberships_of(user=request.user), tenant_id=form.cleaned_data["tenant"]
    )
    request.session[SESSION_TENANT] = membership.tenant_id
    back = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(
        back, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        back = reverse("portal:keys")
    return redirect(back)


# --- keys --------------------------------------------------------------------------------


def _tenant_key(request: HttpRequest, key_id: str) -> ApiKey:
    return get_object_or_404(selectors.api_keys_of(tenant=request.membership.tenant), key_id=key_id)


@member_required
def keys(request: HttpRequest) -> HttpResponse:
    tenant = request.membership.tenant
    return render(
        request,
        "portal/keys.html",
        {"keys": selectors.api_keys_of(tenant=tenant), "now": timezone.now()},
    )


@member_required
def key_create(request: HttpRequest) -> HttpResponse:
    require_owner(request)
    tenant = request.membership.tenant
    form = KeyCreateForm(request.POST or None, plan=tenant.plan)
    if request.method == "POST" and form.is_valid():
        try:
            key, secret = services.api_key_create(
                tenant=tenant, created_by=request.user, **form.service_arguments()
            )
        except ValidationError as error:
            form.add_service_error(error)
        else:
            return _secret_response(
                request, "portal/key_secret.html", {"key": key, "secret": secret, "created": True}
            )
    return render(request, "portal/key_create.html", {"form": form}, status=_form_status(form))


@member_required
def key_rotate(request: HttpRequest, key_id: str) -> HttpResponse:
    key = _tenant_key(request, key_id)
    require_owner(request)
    form = KeyRotateForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            key, secret = services.api_key_rotate(key=key, grace=form.grace)
        except ValidationError as error:
            form.add_service_error(error)
        else:
            return _secret_response(
                request, "portal/key_secret.html", {"key": key, "secret": secret, "created": False}
            )
    return render(
        request, "portal/key_rotate.html", {"key": key, "form": form}, status=_form_status(form)
    )


@member_required
def key_revoke(request: HttpRequest, key_id: str) -> HttpResponse:
    key = _tenant_key(request, key_id)
    require_owner(request)
    if request.method == "POST":
        services.api_key_revoke(key=key)
        messages.success(request, f"Key “{key.name}” is revoked; calls with it now get 401.")
        return redirect("portal:keys")
    return render(
        request,
        "portal/confirm.html",
        {
            "title": f"Revoke “{key.name}”",
            "question": f"Calls with {key.display_prefix} will be refused from now on. "
            "A revoked key cannot be brought back.",
            "action": "Revoke the key",
            "cancel_url": reverse("portal:keys"),
        },
    )


# --- usage -------------------------------------------------------------------------------


def _usage_context(tenant, export_form: UsageExportForm) -> dict:
    # The table by key is read first, the charts' series after it: a record drained between the
    # two reads then shows in the charts and the totals, never in the table alone (as a lazy
    # queryset, read while rendering, the table could count a request the charts did not).
    by_key = list(
        billing_selectors.usage_by_key(
            tenant_id=tenant.id, since=timezone.now().date() - timedelta(days=USAGE_DAYS - 1)
        )
    )
    series = billing_selectors.usage_daily_series(tenant_id=tenant.id, days=USAGE_DAYS)
    models = sorted(series.tokens_by_model)
    daily = [
        {
            "day": day,
            "requests": series.requests[i],
            "tokens": series.tokens[i],
            "cached_tokens": series.cached_tokens[i],
            "cost": series.cost[i],
            "by_model": [series.tokens_by_model[model][i] for model in models],
        }
        for i, day in enumerate(series.days)
    ]
    return {
        "quotas": selectors.quota_status(tenant=tenant),
        "chart_data": {
            "days": [day.isoformat() for day in series.days],
            "requests": series.requests,
            "tokens_by_model": {model: series.tokens_by_model[model] for model in models},
            # Decimals as strings (json_script's encoder): the chart draws them, nothing sums.
            "cost_by_model": {
                model: [str(cost) for cost in series.cost_by_model[model]] for model in models
            },
            "currency": settings.DMX_CURRENCY,
        },
        "models": models,
        "daily": daily[::-1],  # newest first, as the other tables
        "total_requests": sum(series.requests),
        "total_tokens": sum(series.tokens),
        "total_cached_tokens": sum(series.cached_tokens),
        "total_cost": sum(series.cost, Decimal(0)),
        "by_key": by_key,
        "export_form": export_form,
        "usage_days": USAGE_DAYS,
        "stored_responses": stored_responses_usage(tenant_id=tenant.id),
        "stored_retention_days": settings.DMX_RESPONSES_RETENTION_DAYS,
    }


@member_required
def usage(request: HttpRequest) -> HttpResponse:
    today = timezone.now().date()
    export_form = UsageExportForm(
        initial={"since": today - timedelta(days=USAGE_DAYS - 1), "until": today}
    )
    return render(
        request, "portal/usage.html", _usage_context(request.membership.tenant, export_form)
    )


@member_required
def usage_export(request: HttpRequest) -> HttpResponse:
    """The tenant's raw usage records of a range of UTC days (both included), as CSV."""
    tenant = request.membership.tenant
    form = UsageExportForm(request.GET)
    if not form.is_valid():
        return render(request, "portal/usage.html", _usage_context(tenant, form), status=400)
    since, until = form.cleaned_data["since"], form.cleaned_data["until"]
    records = billing_selectors.usage_records_of(
        tenant_id=tenant.id,
        since=datetime.combine(since, time.min, tzinfo=UTC),
        until=datetime.combine(until + timedelta(days=1), time.min, tzinfo=UTC),
    ).order_by("created_at")
    response = StreamingHttpResponse(usage_csv_lines(records), content_type="text/csv")
    response["Content-Disposition"] = (
        f'attachment; filename="usage-{tenant.slug}-{since.isoformat()}-{until.isoformat()}.csv"'
    )
    return response


# --- batches -----------------------------------------------------------------------------

BATCHES_SHOWN = 50


@member_required
def batches(request: HttpRequest) -> HttpResponse:
    """The tenant's latest batches (/v1/batches): progress, tokens, cost so far, and their
    output and error files."""
    tenant = request.membership.tenant
    shown = list(batch_selectors.batches_of_tenant(tenant.id)[:BATCHES_SHOWN])
    usage = billing_selectors.usage_of_batches(batch_ids=[batch.id for batch in shown])
    rows = [
        (batch, sum((node["cost"] or 0 for node in usage.get(batch.id, {}).values()), Decimal(0)))
        for batch in shown
    ]
    return render(request, "portal/batches.html", {"rows": rows})


@member_required
def batch_file(request: HttpRequest, file_id: str) -> HttpResponse:
    """A batch file of the tenant's, downloaded (another tenant's is not found)."""
    try:
        file = batch_selectors.file_get(file_id, request.membership.tenant.id)
    except NotFoundError:
        raise Http404 from None
    return FileResponse(file.content.open("rb"), as_attachment=True, filename=file.filename)


# --- billing -----------------------------------------------------------------------------


def _billing_context(request: HttpRequest, **forms) -> dict:
    """The billing page: the account, its movements (a page of them), each budget's spend this
    period, and the forms (the ones given, bound, else empty)."""
    tenant = request.membership.tenant
    account = billing_selectors.account_find(tenant.id)  # None: postpaid, nothing moved yet
    keys = selectors.api_keys_of(tenant=tenant).filter(revoked_at__isnull=True).order_by("name")
    alerts_initial = BillingAlertsForm.initial_from(account) if account else {}
    movements = Paginator(billing_selectors.movements_of(tenant.id), MOVEMENTS_PER_PAGE)
    return {
        "account": account,
        "balance": account.balance if account is not None else Decimal(0),
        "prepaid": account is not None and account.mode == BillingMode.PREPAID,
        "alert_percent": settings.DMX_BUDGET_ALERT_PERCENT,
        "movements": movements.get_page(request.GET.get("page")),
        "budgets": billing_selectors.budget_status(tenant.id),
        "redeem_form": forms.get("redeem_form") or RedeemForm(),
        "budget_form": forms.get("budget_form") or BudgetForm(keys=keys),
        "alerts_form": forms.get("alerts_form") or BillingAlertsForm(initial=alerts_initial),
    }


def _webhook_secret(request: HttpRequest, account: BillingAccount | None) -> str:
    """The signing secret of the account's webhook, for its owners only, made the first time
    it is shown (docs/use/billing-webhooks.md); empty without a webhook."""
    if account is None or not account.webhook_url or not request.membership.is_owner:
        return ""
    return billing_services.webhook_secret_ensure(account=account)


def _billing_page(request: HttpRequest, status: int = 200, **forms) -> HttpResponse:
    context = _billing_context(request, **forms)
    context["webhook_secret"] = _webhook_secret(request, context["account"])
    response = render(request, "portal/billing.html", context, status=status)
    if context["webhook_secret"]:
        add_never_cache_headers(response)
    return response


@member_required
def billing(request: HttpRequest) -> HttpResponse:
    return _billing_page(request)


@member_required
@require_POST
def redeem(request: HttpRequest) -> HttpResponse:
    """Redeem a code for the tenant: owners and members alike (it only ever adds money)."""
    form = RedeemForm(request.POST)
    if form.is_valid():
        try:
            movement = billing_services.redeem(
                tenant_id=request.membership.tenant_id,
                code=form.cleaned_data["code"],
                actor=request.user.get_username(),
            )
        except billing_services.RedemptionError as error:
            form.add_error("code", str(error))
        else:
            messages.success(
                request,
                f"{money_text(movement.amount)} credited: the balance is "
                f"{money_text(movement.balance_after)}.",
            )
            return redirect("portal:billing")
    return _billing_page(request, status=400, redeem_form=form)


@member_required
@require_POST
def budget_set(request: HttpRequest) -> HttpResponse:
    require_owner(request)
    tenant = request.membership.tenant
    keys = selectors.api_keys_of(tenant=tenant).filter(revoked_at__isnull=True)
    form = BudgetForm(request.POST, keys=keys)
    if form.is_valid():
        try:
            billing_services.budget_set(tenant_id=tenant.id, **form.service_arguments())
        except ValidationError as error:
            form.add_service_error(error)
        except billing_services.BudgetLocked as error:
            form.add_error(None, str(error))
        else:
            messages.success(request, "The budget is set; the next request is checked against it.")
            return redirect("portal:billing")
    return _billing_page(request, status=400, budget_form=form)


@member_required
def budget_delete(request: HttpRequest, budget_id: int) -> HttpResponse:
    budget = get_object_or_404(
        billing_selectors.budgets_of(request.membership.tenant_id), id=budget_id
    )
    require_owner(request)
    if budget.locked:
        messages.error(request, str(billing_services.BudgetLocked(budget)))
        return redirect("portal:billing")
    if request.method == "POST":
        billing_services.budget_delete(budget=budget)
        messages.success(request, "The budget is removed.")
        return redirect("portal:billing")
    scope = f"key “{budget.api_key.name}”" if budget.api_key else "the whole tenant"
    return render(
        request,
        "portal/confirm.html",
        {
            "title": "Remove a budget",
            "question": f"The {budget.get_period_display().lower()} budget of "
            f"{money_text(budget.amount)} for {scope} will no longer limit or alert.",
            "action": "Remove the budget",
            "cancel_url": reverse("portal:billing"),
        },
    )


@member_required
@require_POST
def billing_alerts(request: HttpRequest) -> HttpResponse:
    """The low-balance threshold and where alerts go (owners)."""
    require_owner(request)
    form = BillingAlertsForm(request.POST)
    if form.is_valid():
        account = billing_services.account_of(request.membership.tenant_id)
        try:
            billing_services.account_update(account=account, **form.cleaned_data)
        except ValidationError as error:
            form.add_service_error(error)
        else:
            messages.success(request, "The alert settings are saved.")
            return redirect("portal:billing")
    return _billing_page(request, status=400, alerts_form=form)


def _statement_request(request: HttpRequest) -> tuple[StatementForm, date | None]:
    """The month asked for (`?month=YYYY-MM`), this UTC month when none is; None: not a month."""
    this_month = timezone.now().date().replace(day=1)
    if "month" not in request.GET:
        return StatementForm(initial={"month": this_month}), this_month
    form = StatementForm(request.GET)
    return form, form.cleaned_data["month"] if form.is_valid() else None


@member_required
def statement(request: HttpRequest) -> HttpResponse:
    """A month's usage and cost per model and, for a prepaid tenant, its balance movements."""
    form, month = _statement_request(request)
    if month is None:
        return render(request, "portal/statement.html", {"form": form}, status=400)
    tenant = request.membership.tenant
    found = billing_selectors.statement_of(tenant_id=tenant.id, month=month)
    account = billing_selectors.account_find(tenant.id)
    start, end = billing_selectors.month_bounds(month)
    context = {
        "form": form,
        "statement": found,
        "totals": statement_totals(found),
        "prepaid": account is not None and account.mode == BillingMode.PREPAID,
        # By kind, in the ledger's order of kinds (top-ups first, refunds and adjustments last).
        "movements": [
            (kind.label, found.movements[kind]) for kind in MovementKind if kind in found.movements
        ],
        "previous": (start - timedelta(days=1)).replace(day=1),
        "following": end,
        "this_month": timezone.now().date().replace(day=1),
    }
    return render(request, "portal/statement.html", context)


@member_required
def statement_export(request: HttpRequest) -> HttpResponse:
    form, month = _statement_request(request)
    if month is None:
        return render(request, "portal/statement.html", {"form": form}, status=400)
    tenant = request.membership.tenant
    found = billing_selectors.statement_of(tenant_id=tenant.id, month=month)
    response = HttpResponse(statement_csv(found), content_type="text/csv")
    response["Content-Disposition"] = (
        f'attachment; filename="statement-{tenant.slug}-{month:%Y-%m}.csv"'
    )
    return response


def prices(request: HttpRequest) -> HttpResponse:
    """The public price list: open to anyone, so a developer sees a model's cost before signing
    up; a signed-in member also sees their plan's multiplier."""
    membership = current_membership(request) if request.user.is_authenticated else None
    plan = membership.tenant.plan if membership else None
    multiplier = plan.price_multiplier if plan is not None else None
    context = {
        "lines": billing_selectors.price_list(),
        "multiplier": multiplier if multiplier is not None and multiplier != 1 else None,
        "plan": plan,
    }
    return render(request, "portal/prices.html", context)


# --- members -----------------------------------------------------------------------------


@member_required
def members(request: HttpRequest) -> HttpResponse:
    """The tenant's members; owners invite (POST), change roles and remove."""
    tenant = request.membership.tenant
    form = InviteForm(request.POST or None)
    if request.method == "POST":
        require_owner(request)
        if form.is_valid():
            try:
                services.member_invite(
                    tenant=tenant,
                    email=form.cleaned_data["email"],
                    role=form.cleaned_data["role"],
                    invited_by=request.user,
                    accept_url=lambda token: request.build_absolute_uri(
                        reverse("portal:invitation_accept", args=[token])
                    ),
                )
            except ValidationError as error:
                form.add_service_error(error)
            else:
                messages.success(request, f"Invitation sent to {form.cleaned_data['email']}.")
                return redirect("portal:members")
    context = {
        "members": selectors.tenant_members(tenant=tenant),
        "invitations": selectors.tenant_invitations_open(tenant=tenant),
        "invite_form": form,
        "roles": MemberRole.choices,
    }
    return render(request, "portal/members.html", context, status=_form_status(form))


def _tenant_membership(request: HttpRequest, membership_id: int):
    return get_object_or_404(
        selectors.tenant_members(tenant=request.membership.tenant), id=membership_id
    )


@member_required
@require_POST
def member_role(request: HttpRequest, membership_id: int) -> HttpResponse:
    membership = _tenant_membership(request, membership_id)
    require_owner(request)
    form = RoleForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Choose a role.")
        return redirect("portal:members")
    try:
        services.member_role_change(membership=membership, role=form.cleaned_data["role"])
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
    else:
        messages.success(
            request, f"{membership.user.email} is now {membership.get_role_display().lower()}."
        )
    return redirect("portal:members")


@member_required
def member_remove(request: HttpRequest, membership_id: int) -> HttpResponse:
    membership = _tenant_membership(request, membership_id)
    require_owner(request)
    if request.method == "POST":
        try:
            services.member_remove(membership=membership)
        except ValidationError as error:
            messages.error(request, " ".join(error.messages))
        else:
            messages.success(request, f"{membership.user.email} was removed.")
        return redirect("portal:members")
    return render(
        request,
        "portal/confirm.html",
        {
            "title": f"Remove {membership.user.email}",
            "question": f"They lose access to {membership.tenant.name}, its keys and its usage.",
            "action": "Remove",
            "cancel_url": reverse("portal:members"),
        },
    )


@member_required
@require_POST
def invitation_withdraw(request: HttpRequest, invitation_id: int) -> HttpResponse:
    invitation = get_object_or_404(
        selectors.tenant_invitations_open(tenant=request.membership.tenant), id=invitation_id
    )
    require_owner(request)
    services.invitation_withdraw(invitation=invitation)
    messages.success(request, f"The invitation of {invitation.email} is withdrawn.")
    return redirect("portal:members")


def invitation_accept(request: HttpRequest, token: str) -> HttpResponse:
    """Show an invitation; a signed-in user with the invited, verified address joins (POST)."""
    invitation = selectors.invitation_find(token=token)
    usable = (
        invitation is not None
        and invitation.accepted_at is None
        and invitation.expires_at > timezone.now()
    )
    error = ""
    if request.method == "POST" and usable and request.user.is_authenticated:
        try:
            membership = services.invitation_accept(token=token, user=request.user)
        except ValidationError as refusal:
            error = " ".join(refusal.messages)
        else:
            request.session[SESSION_TENANT] = membership.tenant_id
            messages.success(request, f"You joined {membership.tenant.name}.")
            return redirect("portal:keys")
    context = {"invitation": invitation if usable else None, "error": error}
    status = 404 if not usable else 400 if error else 200
    return render(request, "portal/invitation.html", context, status=status)


# --- management tokens -------------------------------------------------------------------


@member_required
def tokens(request: HttpRequest) -> HttpResponse:
    """The user's management tokens in this tenant; a new one is shown once, in this reply."""
    tenant = request.membership.tenant
    form = TokenCreateForm(request.POST or None)
    created, secret = None, ""
    if request.method == "POST" and form.is_valid():
        try:
            created, secret = services.management_token_create(
                user=request.user,
                tenant=tenant,
                name=form.cleaned_data["name"],
                scope=form.cleaned_data["scope"],
                expires_at=form.expires_at,
            )
        except ValidationError as error:
            form.add_service_error(error)
        else:
            form = TokenCreateForm()
    context = {
        "tokens": selectors.management_tokens_of(user=request.user, tenant=tenant),
        "form": form,
        "created": created,
        "secret": secret,
        "now": timezone.now(),
    }
    if secret:
        return _secret_response(request, "portal/tokens.html", context)
    return render(request, "portal/tokens.html", context, status=_form_status(form))


@member_required
def token_revoke(request: HttpRequest, token_id: str) -> HttpResponse:
    token = get_object_or_404(
        selectors.management_tokens_of(user=request.user, tenant=request.membership.tenant),
        token_id=token_id,
    )
    if request.method == "POST":
        services.management_token_revoke(token=token)
        messages.success(request, f"Token “{token.name}” is revoked.")
        return redirect("portal:tokens")
    return render(
        request,
        "portal/confirm.html",
        {
            "title": f"Revoke “{token.name}”",
            "question": f"Calls to the management API with {token.display_prefix} will get 401.",
            "action": "Revoke the token",
            "cancel_url": reverse("portal:tokens"),
        },
    )


# --- docs --------------------------------------------------------------------------------


def _api_base_url(request: HttpRequest) -> str:
    """Where developers send /v1 calls: the public address operators set, else this one."""
    base = (settings.DMX_PUBLIC_API_URL or request.build_absolute_uri("/")).rstrip("/")
    return base if base.endswith("/v1") else f"{base}/v1"


@member_required
def docs(request: HttpRequest) -> HttpResponse:
    tenant = request.membership.tenant
    models = list(llm_models_active())
    key = selectors.api_keys_of(tenant=tenant).filter(revoked_at__isnull=True).first()
    allowed = key.allowed_models if key is not None else []
    usable = [m.name for m in models if not allowed or m.name in allowed]
    kinds = {m.name: m.kind for m in models}

    def example(kind: str) -> str | None:
        return next((name for name in usable if kinds[name] == kind), None)

    base_url = _api_base_url(request)
    context = {
        "base_url": base_url,
        # Anthropic's clients add /v1/messages to their base URL themselves.
        "anthropic_base_url": base_url.removesuffix("/v1"),
        "models": models,
        "key": key,
        "key_hint": f"{KEY_PREFIX}{key.key_id}_..." if key else f"{KEY_PREFIX}...",
        "example_model": example(ModelKind.GENERATE) or "MODEL",
        "example_embed_model": example(ModelKind.EMBED),
    }
    return render(request, "portal/docs.html", context)


@member_required
def playground(request: HttpRequest) -> HttpResponse:
    """Chat with a model through one of the tenant's live keys: the page's script streams the
    answer over the playground's WebSocket (apps.portal.consumers)."""
    keys = (
        selectors.api_keys_of(tenant=request.membership.tenant)
        .filter(revoked_at__isnull=True)
        .exclude(expires_at__lte=timezone.now())
        .order_by("name")
    )
    context = {
        "keys": keys,
        # Chat only: an embedding model answers no chat (400 unsupported_model).
        "models": list(llm_models_active().filter(kind=ModelKind.GENERATE)),
        # The script offers a key's own models only; an empty list allows them all.
        "key_models": {key.key_id: list(key.allowed_models or ()) for key in keys},
    }
    return render(request, "portal/playground.html", context)
