from django.apps import AppConfig


class KeysConfig(AppConfig):
    name = "apps.keys"
    verbose_name = "Keys, tenants and usage"

    def ready(self) -> None:
        from apps.billing.signals import tenant_billing_changed
        from apps.keys.services import tenant_keys_publish

        def republish(sender, *, tenant_id: int, **kwargs) -> None:
            tenant_keys_publish(tenant_ids=[tenant_id])

        # Billing sits below keys and cannot call it: the key records that carry a tenant's
        # budgets and billing mode follow its changes through this signal.
        tenant_billing_changed.connect(republish, weak=False, dispatch_uid="keys-billing")
