"""The management API's billing: prices, a tenant's account, movements, budgets, redemptions,
usage records, daily totals and monthly statements, and operators' top-ups, prices and code
batches."""

from django.urls import path

from apps.billing.api import views

urlpatterns = [
    path("prices", views.PriceList.as_view(), name="price-list"),
    path("billing/account", views.AccountDetail.as_view(), name="billing-account"),
    path("billing/movements", views.MovementList.as_view(), name="billing-movements"),
    path("billing/budgets", views.BudgetList.as_view(), name="budget-list"),
    path("billing/budgets/<int:pk>", views.BudgetDetail.as_view(), name="budget-detail"),
    path("billing/redeem", views.Redeem.as_view(), name="billing-redeem"),
    path("billing/statement", views.StatementDetail.as_view(), name="billing-statement"),
    path("usage/records", views.UsageRecordList.as_view(), name="usage-records"),
    path("usage/daily", views.UsageDailyList.as_view(), name="usage-daily"),
    path(
        "tenants/<int:pk>/billing-account",
        views.TenantAccount.as_view(),
        name="tenant-billing-account",
    ),
    path("tenants/<int:pk>/top-ups", views.TenantTopUp.as_view(), name="tenant-top-up"),
    path("model-versions/<int:pk>/prices", views.VersionPrices.as_view(), name="version-prices"),
    path("redemption-batches", views.BatchList.as_view(), name="redemption-batch-list"),
    path(
        "redemption-batches/<int:pk>",
        views.BatchDetail.as_view(),
        name="redemption-batch-detail",
    ),
]
