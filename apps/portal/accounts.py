"""django-allauth's hooks: a new account gets its tenant."""

from __future__ import annotations

from allauth.account.adapter import DefaultAccountAdapter

from apps.keys.services import tenant_sign_up


class AccountAdapter(DefaultAccountAdapter):
    def save_user(self, request, user, form, commit: bool = True):
        user = super().save_user(request, user, form, commit=commit)
        if commit:
            tenant_sign_up(user=user)
        return user
