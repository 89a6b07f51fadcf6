"""What billing tells the apps above it, which it does not import: the keys app republishes a
tenant's key records (the gateway's copy of its budgets, mode and multiplier) on this."""

from django.dispatch import Signal

# sender: the model class changed; tenant_id: whose records to republish, after the commit.
tenant_billing_changed = Signal()
