"""The management API's billing: the price list (any member), a tenant's account, movements,
budgets, redemptions, usage records, daily totals and statements (its own), and operators'
top-ups, prices and code batches. Each view checks its input, calls one service or selector
and serializes; who the caller is and which tenant it acts in come from dmxplatform.api (the
identity app, named in settings)."""

from __future__ import annotations

import re

from django.db import transaction
from django.http import Http404
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_view,
)
from rest_framework import generics
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.billing.api.filters import MovementFilter, UsageDailyFilter, UsageRecordFilter
from apps.billing.api.serializers import (
    AccountInput,
    AccountOutput,
    BatchDetailOutput,
    BatchInput,
    BatchOutput,
    BatchWithCodes,
    BudgetChangeInput,
    BudgetInput,
    BudgetOutput,
    MovementOutput,
    OperatorAccountInput,
    OperatorAccountOutput,
    PriceInput,
    PriceListOutput,
    PriceOutput,
    RedeemInput,
    StatementOutput,
    StatementQuery,
    TopUpInput,
    UsageDailyOutput,
    UsageRecordOutput,
)
from apps.billing.errors import BillingErrorCode
from apps.billing.models import (
    BalanceMovement,
    BillingAccount,
    Budget,
    Price,
    UsageDaily,
    UsageRecord,
)
from apps.billing.selectors import (
    BudgetStatus,
    account_find,
    budget_status,
    movements_of,
    price_list,
    prices_of_version,
    statement_of,
    usage_daily_of,
    usage_records_of,
)
from apps.billing.selectors.admin_api import (
    api_key_of_tenant,
    batches_with_counts,
    model_version_exists,
    tenant_exists,
)
from apps.billing.services import (
    RedemptionError,
    account_of,
    account_update,
    budget_delete,
    budget_set,
    codes_generate,
    price_set,
    redeem,
    top_up,
)
from dmxplatform.api import ManagementApiMixin, NewestFirst, OperatorApiMixin, TenantScopedApiMixin
from dmxplatform.api.schema import ERROR
from dmxplatform.errors import ConflictError, InvalidRequestError

# What the codes' responses may never be kept as: a cache would hold them in the clear.
NOT_STORED = {"Cache-Control": "no-store"}
# An Idempotency-Key: printable ASCII, short enough to sit in a movement's key beside its prefix.
IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]{1,100}")


class ByTime(NewestFirst):
    ordering = ("-created_at", "-id")


def _actor(request: Request) -> str:
    return request.user.get_username()


def _account_changed(tenant_id: int, values: dict) -> BillingAccount:
    """account_update on the account as it is now, under its lock: the row it saves whole
    carries the balance, which a charge or a credit may have moved since an unlocked read."""
    with transaction.atomic():
        return account_update(account=account_of(tenant_id, lock=True), **values)


# Prices ----------------------------------------------------------------------------------------


class PriceList(ManagementApiMixin, APIView):
    pagination_class = None  # a price per model version offered: tens

    @extend_schema(
        summary="List what each model costs, per million tokens",
        description="Each active model version's price in force and the next one scheduled, in "
        "the platform's currency, before any plan's multiplier. A version without a price is "
        "not offered to tenants that pay.",
        tags=["prices"],
        responses=PriceListOutput(many=True),
    )
    def get(self, request: Request) -> Response:
        return Response(PriceListOutput(price_list(), many=True).data)


# A tenant's account and movements -------------------------------------------------------------


@extend_schema_view(
    get=extend_schema(summary="Show the tenant's billing account", tags=["billing"]),
    patch=extend_schema(
        summary="Change where and when the tenant's balance alerts go",
        description="Owners only. The mode (prepaid or postpaid) is the operators' to set.",
        tags=["billing"],
        request=AccountInput,
        responses=AccountOutput,
    ),
)
class AccountDetail(TenantScopedApiMixin, generics.GenericAPIView):
    queryset = BillingAccount.objects.none()
    serializer_class = AccountOutput
    owners_change = True

    def get(self, request: Request) -> Response:
        account = account_find(self.tenant_id) or BillingAccount(tenant_id=self.tenant_id)
        return Response(AccountOutput(account).data)

    def patch(self, request: Request) -> Response:
        values = self.validated(AccountInput, partial=True)
        return Response(AccountOutput(_account_changed(self.tenant_id, values)).data)


@extend_schema_view(
    get=extend_schema(
        summary="List the tenant's balance movements, newest first",
        description="Top-ups, redemptions, usage charges (one per request, prepaid tenants), "
        "refunds and adjustments; the balance is their sum.",
        tags=["billing"],
    )
)
class MovementList(TenantScopedApiMixin, generics.ListAPIView):
    queryset = BalanceMovement.objects.none()
    serializer_class = MovementOutput
    filterset_class = MovementFilter
    pagination_class = ByTime

    def get_queryset(self):
        return movements_of(self.tenant_id)


# Budgets ---------------------------------------------------------------------------------------


class BudgetMixin(TenantScopedApiMixin):
    queryset = Budget.objects.none()
    serializer_class = BudgetOutput
    pagination_class = None  # one per period for the tenant and for each key: a handful
    owners_change = True

    def status_of(self, pk: int) -> BudgetStatus:
        """The tenant's budget `pk` and its spend; another tenant's is never found."""
        for status in budget_status(self.tenant_id):
            if status.budget.id == pk:
                return status
        raise Http404


@extend_schema_view(
    get=extend_schema(
        summary="List the tenant's budgets and their spend this period",
        tags=["billing"],
        responses=BudgetOutput(many=True),
    ),
    post=extend_schema(
        summary="Set a budget for the tenant or one of its keys",
        description="Owners only. One budget per key (or the whole tenant) and period: setting "
        "it again replaces it. A hard budget refuses a request that could pass it (429 "
        "`insufficient_quota`); a soft one alerts at 80% and 100%. A budget the operators set "
        "(`locked`) is theirs: replacing it is a 403 (`budget_locked`).",
        tags=["billing"],
        request=BudgetInput,
        responses={201: BudgetOutput},
    ),
)
class BudgetList(BudgetMixin, generics.GenericAPIView):
    def get(self, request: Request) -> Response:
        return Response(BudgetOutput(budget_status(self.tenant_id), many=True).data)

    def post(self, request: Request) -> Response:
        fields = self.validated(BudgetInput)
        key = fields.pop("key", None)
        api_key_id = None
        if key:
            api_key_id = api_key_of_tenant(tenant_id=self.tenant_id, key_id=key)
            if api_key_id is None:
                raise ValidationError({"key": "No key of this tenant has this id."})
        budget = budget_set(tenant_id=self.tenant_id, api_key_id=api_key_id, **fields)
        return Response(BudgetOutput(self.status_of(budget.id)).data, status=201)


@extend_schema_view(
    get=extend_schema(summary="Show a budget and its spend this period", tags=["billing"]),
    patch=extend_schema(
        summary="Change a budget's amount or whether it is hard",
        description="Owners only; not a budget the operators set (403 `budget_locked`).",
        tags=["billing"],
        request=BudgetChangeInput,
        responses=BudgetOutput,
    ),
    delete=extend_schema(
        summary="Delete a budget",
        description="Owners only; not a budget the operators set (403 `budget_locked`).",
        tags=["billing"],
        responses={204: None},
    ),
)
class BudgetDetail(BudgetMixin, generics.GenericAPIView):
    def get(self, request: Request, pk: int) -> Response:
        return Response(BudgetOutput(self.status_of(pk)).data)

    def patch(self, request: Request, pk: int) -> Response:
        budget = self.status_of(pk).budget
        fields = self.validated(BudgetChangeInput, partial=True)
        budget_set(
            tenant_id=self.tenant_id,
            api_key_id=budget.api_key_id,
            period=budget.period,
            amount=fields.get("amount", budget.amount),
            hard=fields.get("hard", budget.hard),
        )
        return Response(BudgetOutput(self.status_of(pk)).data)

    def delete(self, request: Request, pk: int) -> Response:
        budget_delete(budget=self.status_of(pk).budget)
        return Response(status=204)


# Redemption ------------------------------------------------------------------------------------

# A code already redeemed is a conflict with what happened; an unknown or expired one, bad input.
_REDEMPTION_ERRORS = {
    BillingErrorCode.CODE_USED: ConflictError,
    BillingErrorCode.CODE_INVALID: InvalidRequestError,
    BillingErrorCode.CODE_EXPIRED: InvalidRequestError,
}


class Redeem(TenantScopedApiMixin, generics.GenericAPIView):
    queryset = BalanceMovement.objects.none()
    serializer_class = MovementOutput

    @extend_schema(
        summary="Redeem a code: its value is credited to the tenant's balance",
        description="A code credits one tenant once, however many redeem it at the same time. "
        "An unknown or expired code is a 400 (`redemption_code_invalid`, "
        "`redemption_code_expired`), one already redeemed a 409 (`redemption_code_used`).",
        tags=["billing"],
        request=RedeemInput,
        responses={
            201: MovementOutput,
            409: OpenApiResponse(ERROR, description="The code was already redeemed."),
        },
    )
    def post(self, request: Request) -> Response:
        code = self.validated(RedeemInput)["code"]
        try:
            movement = redeem(tenant_id=self.tenant_id, code=code, actor=_actor(request))
        except RedemptionError as error:
            refusal = _REDEMPTION_ERRORS[error.code]
            raise refusal(str(error), code=error.code, param="code") from None
        return Response(MovementOutput(movement).data, status=201)


# Operators: a tenant's account and top-ups ----------------------------------------------------


class TenantAccountMixin(OperatorApiMixin):
    queryset = BillingAccount.objects.none()  # operators change billing accounts

    def tenant_id(self, pk: int) -> int:
        if not tenant_exists(pk):
            raise Http404
        return pk


@extend_schema_view(
    get=extend_schema(summary="Show a tenant's billing account (operators)", tags=["billing"]),
    patch=extend_schema(
        summary="Make a tenant prepaid or postpaid, or change its alerts (operators)",
        description="Every gateway applies the mode to the tenant's keys within a second.",
        tags=["billing"],
        request=OperatorAccountInput,
        responses=OperatorAccountOutput,
    ),
)
class TenantAccount(TenantAccountMixin, generics.GenericAPIView):
    serializer_class = OperatorAccountOutput

    def get(self, request: Request, pk: int) -> Response:
        tenant_id = self.tenant_id(pk)
        account = account_find(tenant_id) or BillingAccount(tenant_id=tenant_id)
        return Response(OperatorAccountOutput(account).data)

    def patch(self, request: Request, pk: int) -> Response:
        tenant_id = self.tenant_id(pk)
        values = self.validated(OperatorAccountInput, partial=True)
        return Response(OperatorAccountOutput(_account_changed(tenant_id, values)).data)


class TenantTopUp(TenantAccountMixin, generics.GenericAPIView):
    serializer_class = MovementOutput

    @extend_schema(
        summary="Top up a tenant's balance (operators)",
        description="With an `Idempotency-Key` header, a retried call tops up once and answers "
        "as the first did; the same key with another amount is a 409. Each top-up is a "
        "balance movement, in the audit log with its operator.",
        tags=["billing"],
        parameters=[
            OpenApiParameter(
                "Idempotency-Key",
                OpenApiTypes.STR,
                OpenApiParameter.HEADER,
                description="Up to 100 printable ASCII characters, unique per top-up.",
            )
        ],
        request=TopUpInput,
        responses={
            201: MovementOutput,
            409: OpenApiResponse(ERROR, description="The key was used for another top-up."),
        },
    )
    def post(self, request: Request, pk: int) -> Response:
        tenant_id = self.tenant_id(pk)
        key = request.headers.get("Idempotency-Key", "")
        if key and not IDEMPOTENCY_KEY.fullmatch(key):
            raise InvalidRequestError(
                "Idempotency-Key: 1 to 100 printable ASCII characters.", param="Idempotency-Key"
            )
        fields = self.validated(TopUpInput)
        movement = top_up(tenant_id=tenant_id, actor=_actor(request), key=key, **fields)
        if movement.amount != fields["amount"]:
            raise ConflictError(
                f"This Idempotency-Key was used for a top-up of {movement.amount}.",
                code="idempotency_key_reused",
                param="Idempotency-Key",
            )
        return Response(MovementOutput(movement).data, status=201)


# Operators: prices -----------------------------------------------------------------------------


@extend_schema_view(
    get=extend_schema(
        summary="List a model version's prices, newest first (operators)",
        tags=["prices"],
        responses=PriceOutput(many=True),
    ),
    post=extend_schema(
        summary="Set a model version's price from a moment on (operators)",
        description="A price is never changed: a new one takes over from its `effective_from`, "
        "which for a priced version is no earlier than DMX_PRICE_LEAD_SECONDS from now, so "
        "past costs never move. All three prices zero marks the version free.",
        tags=["prices"],
        request=PriceInput,
        responses={201: PriceOutput},
    ),
)
class VersionPrices(OperatorApiMixin, generics.GenericAPIView):
    queryset = Price.objects.none()
    serializer_class = PriceOutput
    pagination_class = None  # a version's price changes: a handful

    def version_id(self, pk: int) -> int:
        if not model_version_exists(pk):
            raise Http404
        return pk

    def get(self, request: Request, pk: int) -> Response:
        prices = prices_of_version(self.version_id(pk)).select_related("model_version__model")
        return Response(PriceOutput(prices, many=True).data)

    def post(self, request: Request, pk: int) -> Response:
        version_id = self.version_id(pk)
        fields = self.validated(PriceInput)
        price = price_set(model_version_id=version_id, actor=_actor(request), **fields)
        return Response(PriceOutput(price).data, status=201)


# Operators: redemption code batches ------------------------------------------------------------


class BatchMixin(OperatorApiMixin):
    serializer_class = BatchOutput

    def get_queryset(self):
        return batches_with_counts()


@extend_schema_view(
    get=extend_schema(summary="List redemption code batches (operators)", tags=["billing"]),
    post=extend_schema(
        summary="Generate a batch of redemption codes (operators)",
        description="The response carries the codes, this once: they are stored only as their "
        "HMACs. Each credits its face value to one tenant, once.",
        tags=["billing"],
        request=BatchInput,
        responses={201: BatchWithCodes},
    ),
)
class BatchList(BatchMixin, generics.ListAPIView):
    def post(self, request: Request) -> Response:
        batch, codes = codes_generate(actor=_actor(request), **self.validated(BatchInput))
        shown = self.get_queryset().get(pk=batch.pk)
        shown.plaintext_codes = codes
        return Response(BatchWithCodes(shown).data, status=201, headers=NOT_STORED)


@extend_schema_view(
    get=extend_schema(
        summary="Show a batch and which of its codes were redeemed (operators)", tags=["billing"]
    )
)
class BatchDetail(BatchMixin, generics.RetrieveAPIView):
    serializer_class = BatchDetailOutput

    def get_queryset(self):
        return batches_with_counts(with_codes=True)


# Usage and statements -----------------------------------------------------------------------------


@extend_schema_view(
    get=extend_schema(
        summary="List usage records, newest first",
        description="One record per request, filtered by time, key, model and status.",
        tags=["usage"],
    )
)
class UsageRecordList(TenantScopedApiMixin, generics.ListAPIView):
    queryset = UsageRecord.objects.none()
    serializer_class = UsageRecordOutput
    filterset_class = UsageRecordFilter

    def get_queryset(self):
        return usage_records_of(tenant_id=self.tenant_id)


class ByDay(NewestFirst):
    ordering = ("-day", "-id")


@extend_schema_view(
    get=extend_schema(
        summary="List daily usage totals, newest first",
        description="Per UTC day, key and model.",
        tags=["usage"],
    )
)
class UsageDailyList(TenantScopedApiMixin, generics.ListAPIView):
    queryset = UsageDaily.objects.none()
    serializer_class = UsageDailyOutput
    filterset_class = UsageDailyFilter
    pagination_class = ByDay

    def get_queryset(self):
        return usage_daily_of(tenant_id=self.tenant_id).select_related("api_key")


class StatementDetail(TenantScopedApiMixin, APIView):
    @extend_schema(
        summary="Show the tenant's statement for a month: usage and cost per model",
        description="From the daily rollups, which add up to the usage records' costs; for a "
        "prepaid tenant, the month's balance movements by kind too.",
        tags=["billing"],
        parameters=[StatementQuery],
        responses=StatementOutput,
    )
    def get(self, request: Request) -> Response:
        query = StatementQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        month = query.validated_data.get("month") or timezone.now().date()
        return Response(StatementOutput(statement_of(tenant_id=self.tenant_id, month=month)).data)
