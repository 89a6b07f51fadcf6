"""The management API's billing: prices, a tenant's account, movements, budgets and
redemptions, and operators' top-ups, prices and code batches. A tenant's monthly statement is
the keys app's (/billing/statement: it reads the usage rollups)."""

from django.urls import path

from apps.billing.api import views

urlpatterns = [
    path("prices", views.PriceList.as_view(), name="price-list"),
    path("billing/account", views.AccountDetail.as_view(), name="billing-account"),
    path("billing/movements", views.MovementList.as_view(), name="billing-movements"),
    path("billing/budgets", views.BudgetList.as_view(), name="budget-list"),
    path("billing/budgets/<int:pk>", views.BudgetDetail.as_view(), name="budget-detail"),
    path("billing/redeem", views.Redeem.as_view(), name="billing-redeem"),
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
