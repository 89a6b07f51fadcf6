"""Writes for tenants, keys and the usage ledger."""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta

import orjson
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.mail import send_mail
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone
from django.utils.text import slugify

from apps.keys import ledger
from apps.keys.choices import MemberRole, QuotaPeriod, UsageStatus
from apps.keys.keycache import invalidation_channel, invalidation_message, record_key
from apps.keys.models import (
    KEY_PREFIX,
    MANAGEMENT_TOKEN_PREFIX,
    ApiKey,
    Invitation,
    ManagementToken,
    Membership,
    Plan,
    PlanQuota,
    Tenant,
    UsageDaily,
    UsageRecord,
)
from apps.keys.selectors import key_record_from_row
from apps.keys.signing import signing_secret_issue
from dmxplatform import credentials, streams
from dmxplatform.redis_client import request_redis, sync_redis

logger = logging.getLogger(__name__)

# Rows deleted per statement when pruning: small enough not to hold long locks.
USAGE_PRUNE_BATCH = 10_000
# A rotated key's old secret stays valid at most this long: a day is enough to roll a secret out
# to every client, and short enough that a leaked one dies soon.
MAX_ROTATION_GRACE = timedelta(hours=24)
INVITATION_LIFETIME = timedelta(days=7)
# A management token's last use is written at most this often: not a write per API call.
TOKEN_USE_RESOLUTION = timedelta(minutes=1)
MAX_TOKEN_LIFETIME = timedelta(days=366)
LIMIT_NAMES = ("requests_per_minute", "tokens_per_minute", "max_concurrent_requests")
# The limits of the plan new accounts are put on when it does not exist (it was deleted, or the
# database was emptied): a sign-up must never get an unlimited tenant. Migration keys/0004
# seeds the same plan, so operators can edit it before the first sign-up.
NEW_ACCOUNT_LIMITS = {
    "requests_per_minute": 60,
    "tokens_per_minute": 100_000,
    "max_concurrent_requests": 8,
}
NEW_ACCOUNT_MONTHLY_TOKENS = 1_000_000


def tenant_create(*, name: str, slug: str, plan: Plan | None = None) -> Tenant:
    """Create a tenant, approved: operators create tenants they mean to serve."""
    tenant = Tenant(name=name, slug=slug, plan=plan, approved_at=timezone.now())
    tenant.full_clean()
    tenant.save()
    return tenant


def _free_slug(base: str) -> str:
    base = slugify(base)[:48] or "tenant"
    slug = base
    while Tenant.objects.filter(slug=slug).exists():
        slug = f"{base}-{secrets.token_hex(3)}"
    return slug


@transaction.atomic
def tenant_sign_up(*, user) -> Tenant:
    """Give a new account a tenant of its own on the default plan, owned by it; approved at once
    unless operators approve new accounts (DMX_ACCOUNT_APPROVAL_REQUIRED)."""
    plan, created = Plan.objects.get_or_create(
        name=settings.DMX_DEFAULT_PLAN,
        defaults={
            "description": "The plan of new accounts (DMX_DEFAULT_PLAN).",
            **NEW_ACCOUNT_LIMITS,
        },
    )
    if created:
        PlanQuota.objects.create(
            plan=plan, period=QuotaPeriod.MONTH, model="", tokens=NEW_ACCOUNT_MONTHLY_TOKENS
        )
    local = (user.email or user.get_username()).partition("@")[0]
    tenant = Tenant(
        name=local or "My tenant",
        slug=_free_slug(local),
        plan=plan,
        approved_at=None if settings.DMX_ACCOUNT_APPROVAL_REQUIRED else timezone.now(),
    )
    tenant.full_clean()
    tenant.save()
    Membership.objects.create(tenant=tenant, user=user, role=MemberRole.OWNER)
    return tenant


def tenant_approve(*, tenant: Tenant) -> Tenant:
    """Let a tenant waiting for approval create keys."""
    if tenant.approved_at is None:
        tenant.approved_at = timezone.now()
        tenant.save(update_fields=["approved_at"])
    return tenant


def _check_key_allowed(tenant: Tenant) -> None:
    if not tenant.is_approved:
        raise ValidationError(
            "This account is waiting for an operator's approval; keys can be created once it "
            "is approved."
        )
    if not tenant.is_active:
        raise ValidationError("This tenant is suspended.")


def _check_within_plan(key: ApiKey) -> None:
    """A key's own limits may be tighter than its plan's, never looser (both are enforced; a
    looser one would only mislead)."""
    plan = key.tenant.plan
    if plan is None:
        return
    errors = {}
    for name in LIMIT_NAMES:
        mine, cap = getattr(key, name), getattr(plan, name)
        if cap is not None and mine is not None and mine > cap:
            errors[name] = f"At most {cap}, the plan's limit."
    if errors:
        raise ValidationError(errors)


def api_key_publish(key: ApiKey) -> None:
    """Write a key's record to Redis and tell every gateway, once the transaction commits."""
    record = key_record_from_row(key)

    def publish() -> None:
        client = sync_redis()
        pipe = client.pipeline(transaction=False)
        pipe.set(record_key(key.key_id), record.encode())
        pipe.publish(invalidation_channel(), invalidation_message(key.key_id))
        pipe.execute()

    transaction.on_commit(publish)


def api_key_create(
    *,
    tenant: Tenant,
    name: str,
    created_by=None,
    allowed_models: list[str] | None = None,
    allowed_networks: list[str] | None = None,
    expires_at: datetime | None = None,
    **limits,
) -> tuple[ApiKey, str]:
    """Create a key; return it and its plaintext, which is never stored nor shown again.

    `limits`: priority, requests_per_minute, tokens_per_minute, max_concurrent_requests,
    token_quota, token_quota_period (see ApiKey).
    """
    _check_key_allowed(tenant)
    issued = credentials.issue(KEY_PREFIX)
    key = ApiKey(
        tenant=tenant,
        name=name,
        created_by=created_by,
        key_id=issued.credential_id,
        secret_hash=issued.secret_hash,
        allowed_models=list(allowed_models or []),
        allowed_networks=list(allowed_networks or []),
        expires_at=expires_at,
        **limits,
    )
    key.full_clean()
    _check_within_plan(key)
    key.save()
    api_key_publish(key)
    return key, issued.plaintext


def api_key_update(*, key: ApiKey) -> ApiKey:
    """Save edits made to a key (admin, portal) and push them to every gateway."""
    key.full_clean()
    _check_within_plan(key)
    key.save()
    api_key_publish(key)
    return key


def api_key_rotate(*, key: ApiKey, grace: timedelta) -> tuple[ApiKey, str]:
    """Give a key a new secret; return it and the plaintext, shown once. The old secret keeps
    working for `grace` (0 to 24 h), so clients can switch without an outage; the key's id,
    limits and usage stay."""
    if not timedelta(0) <= grace <= MAX_ROTATION_GRACE:
        raise ValidationError({"grace": "Between 0 and 24 hours."})
    if key.revoked_at is not None:
        raise ValidationError("A revoked key cannot be rotated.")
    issued = credentials.issue(KEY_PREFIX, key.key_id)
    key.previous_secret_hash = key.secret_hash if grace else ""
    key.previous_secret_expires_at = timezone.now() + grace if grace else None
    key.secret_hash = issued.secret_hash
    key.save(update_fields=["secret_hash", "previous_secret_hash", "previous_secret_expires_at"])
    api_key_publish(key)
    return key, issued.plaintext


def api_key_signing_enable(*, key: ApiKey) -> str:
    """Require signed requests from a key; return its new signing secret, shown once."""
    secret, encrypted = signing_secret_issue()
    key.signing_required = True
    key.signing_secret_encrypted = encrypted
    key.save(update_fields=["signing_required", "signing_secret_encrypted"])
    api_key_publish(key)
    return secret


def tenant_keys_publish(*, tenant_ids: list[int]) -> int:
    """Push the keys of tenants whose plan or status changed; return how many."""
    keys = list(
        ApiKey.objects.filter(tenant_id__in=tenant_ids)
        .select_related("tenant__plan")
        .prefetch_related("tenant__plan__quotas")
    )
    for key in keys:
        api_key_publish(key)
    return len(keys)


def plan_publish(*, plan: Plan) -> int:
    """Push a changed plan to every gateway through its tenants' keys."""
    return tenant_keys_publish(tenant_ids=list(plan.tenants.values_list("id", flat=True)))


@transaction.atomic
def plan_save(*, plan: Plan, quotas: list[dict] | None = None) -> Plan:
    """Create or change a plan and, when `quotas` (PlanQuota fields) are given, replace its
    quotas with them; push the result to every gateway."""
    plan.full_clean()
    plan.save()
    if quotas is not None:
        plan.quotas.all().delete()
        for number, fields in enumerate(quotas, start=1):
            quota = PlanQuota(plan=plan, **fields)
            try:
                quota.full_clean()
            except ValidationError as exc:
                message = f"Quota {number}: {' '.join(exc.messages)}"
                raise ValidationError({"quotas": message}) from exc
            quota.save()
    plan_publish(plan=plan)
    return plan


@transaction.atomic
def plan_edit(
    *,
    plan: Plan,
    quotas_saved: Sequence[PlanQuota] = (),
    quotas_deleted: Sequence[PlanQuota] = (),
) -> Plan:
    """Create or change a plan with the quotas added, changed or removed one by one (the
    admin's inline: a quota left alone keeps its row); push the result to every gateway."""
    plan.full_clean()
    plan.save()
    for quota in quotas_deleted:
        quota.delete()
    for quota in quotas_saved:
        quota.plan = plan
        quota.full_clean()
        quota.save()
    plan_publish(plan=plan)
    return plan


def plan_delete(*, plan: Plan) -> None:
    """Delete a plan no tenant is on."""
    if plan.tenants.exists():
        raise ValidationError("Tenants are on this plan: move them to another one first.")
    plan.delete()


def tenant_update(*, tenant: Tenant) -> Tenant:
    """Save an operator's tenant, new or changed (its plan, a suspension); push it to its
    keys."""
    tenant.full_clean()
    tenant.save()
    tenant_keys_publish(tenant_ids=[tenant.id])
    return tenant


def member_invite(
    *,
    tenant: Tenant,
    email: str,
    role: str,
    invited_by,
    accept_url: Callable[[str], str],
) -> Invitation:
    """Invite someone by email into a tenant; the mail carries the only copy of the token."""
    email = email.strip()
    if Membership.objects.filter(tenant=tenant, user__email__iexact=email).exists():
        raise ValidationError({"email": "Already a member."})
    token = secrets.token_urlsafe(24)
    invitation = Invitation(
        tenant=tenant,
        email=email,
        role=role,
        token_hash=credentials.hash_secret(token),
        invited_by=invited_by,
        expires_at=timezone.now() + INVITATION_LIFETIME,
    )
    invitation.full_clean()
    invitation.save()
    inviter = getattr(invited_by, "email", "") or "An owner"
    send_mail(
        subject=f"You are invited to {tenant.name} on DMX",
        message=(
            f"{inviter} invited you to join {tenant.name} as {invitation.get_role_display()}.\n\n"
            f"Accept within {INVITATION_LIFETIME.days} days: {accept_url(token)}\n"
        ),
        from_email=None,
        recipient_list=[email],
    )
    return invitation


def invitation_withdraw(*, invitation: Invitation) -> None:
    """Withdraw an open invitation: its token no longer lets anyone in."""
    if invitation.accepted_at is not None:
        raise ValidationError("This invitation was accepted already.")
    invitation.delete()


@transaction.atomic
def invitation_accept(*, token: str, user) -> Membership:
    """Join the tenant an invitation names; the user's verified address must be the invited one."""
    from allauth.account.models import EmailAddress

    invitation = (
        Invitation.objects.select_for_update()
        .filter(token_hash=credentials.hash_secret(token))
        .first()
    )
    if invitation is None or invitation.accepted_at is not None:
        raise ValidationError("This invitation is not valid (or was used already).")
    if invitation.expires_at <= timezone.now():
        raise ValidationError("This invitation has expired; ask for a new one.")
    if not EmailAddress.objects.filter(
        user=user, email__iexact=invitation.email, verified=True
    ).exists():
        raise ValidationError(f"This invitation is for {invitation.email}; sign in with it.")
    membership, _ = Membership.objects.get_or_create(
        tenant=invitation.tenant, user=user, defaults={"role": invitation.role}
    )
    invitation.accepted_at = timezone.now()
    invitation.accepted_by = user
    invitation.save(update_fields=["accepted_at", "accepted_by"])
    return membership


def _check_an_owner_stays(membership: Membership) -> None:
    others = Membership.objects.filter(tenant_id=membership.tenant_id, role=MemberRole.OWNER)
    if membership.is_owner and not others.exclude(id=membership.id).exists():
        raise ValidationError("A tenant keeps at least one owner.")


def member_role_change(*, membership: Membership, role: str) -> Membership:
    if role != MemberRole.OWNER:
        _check_an_owner_stays(membership)
    membership.role = role
    membership.full_clean()
    membership.save(update_fields=["role"])
    return membership


def member_remove(*, membership: Membership) -> None:
    _check_an_owner_stays(membership)
    membership.delete()


def management_token_create(
    *, user, tenant: Tenant, name: str, scope: str, expires_at: datetime
) -> tuple[ManagementToken, str]:
    """Create a management token; return it and its plaintext, shown once."""
    if expires_at <= timezone.now() or expires_at > timezone.now() + MAX_TOKEN_LIFETIME:
        raise ValidationError({"expires_at": "Within the next year."})
    issued = credentials.issue(MANAGEMENT_TOKEN_PREFIX)
    token = ManagementToken(
        user=user,
        tenant=tenant,
        name=name,
        token_id=issued.credential_id,
        secret_hash=issued.secret_hash,
        scope=scope,
        expires_at=expires_at,
    )
    token.full_clean()
    token.save()
    return token, issued.plaintext


def management_token_revoke(*, token: ManagementToken) -> ManagementToken:
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
    return token


def management_token_update(*, token: ManagementToken) -> ManagementToken:
    """Save an operator's edit of a token (its name, scope, expiry, revocation); every call
    reads the token from the database, so the next one sees it."""
    token.full_clean()
    token.save()
    return token


def management_token_authenticate(*, plaintext: str) -> ManagementToken | None:
    """The live token a credential names, or None: unknown, wrong secret, revoked, expired, or
    its user no longer active or no longer in its tenant."""
    parts = credentials.split(plaintext, MANAGEMENT_TOKEN_PREFIX)
    if parts is None:
        return None
    token = (
        ManagementToken.objects.select_related("user", "tenant").filter(token_id=parts[0]).first()
    )
    now = timezone.now()
    if (
        token is None
        or not credentials.secret_matches(parts[1], token.secret_hash)
        or token.revoked_at is not None
        or token.expires_at <= now
        or not token.user.is_active
        or not Membership.objects.filter(tenant_id=token.tenant_id, user_id=token.user_id).exists()
    ):
        return None
    if token.last_used_at is None or now - token.last_used_at > TOKEN_USE_RESOLUTION:
        ManagementToken.objects.filter(id=token.id).update(last_used_at=now)
    return token


def api_key_revoke(*, key: ApiKey) -> ApiKey:
    """Revoke a key; every gateway refuses it within a second."""
    if key.revoked_at is None:
        key.revoked_at = timezone.now()
        key.save(update_fields=["revoked_at"])
    api_key_publish(key)
    return key


def _usage_row(event: ledger.UsageEvent) -> UsageRecord:
    return UsageRecord(
        request_id=event.request_id,
        api_key_id=event.api_key_id,
        tenant_id=event.tenant_id,
        created_at=datetime.fromtimestamp(event.created_at, tz=UTC),
        endpoint=event.endpoint,
        model=event.model,
        model_version=event.model_version,
        node=event.node,
        intent=event.intent,
        intent_confidence=event.intent_confidence,
        intent_low_confidence=event.intent_low_confidence,
        stream=event.stream,
        status=event.status,
        http_status=event.http_status,
        error_code=event.error_code,
        prompt_tokens=event.prompt_tokens,
        completion_tokens=event.completion_tokens,
        duration_ms=event.duration_ms,
        time_to_first_token_ms=event.time_to_first_token_ms,
        estimated_prompt_tokens=event.estimated_prompt_tokens,
        context_limit=event.context_limit,
        content_flags=event.content_flags,
        timings=event.timings,
        client_request_id=event.client_request_id,
        trace_id=event.trace_id,
    )


def _usage_rollup(rows: list[UsageRecord]) -> None:
    """Add rows to their (day, key, model) totals; runs in the rows' own transaction."""
    totals: dict[tuple, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for row in rows:
        total = totals[(row.created_at.date(), row.api_key_id, row.tenant_id, row.model)]
        total[0] += 1
        total[1] += row.status != UsageStatus.OK
        total[2] += row.prompt_tokens
        total[3] += row.completion_tokens
    for (day, key_id, tenant_id, model), (requests, errors, prompt, completion) in totals.items():
        updated = UsageDaily.objects.filter(day=day, api_key_id=key_id, model=model).update(
            requests=F("requests") + requests,
            errors=F("errors") + errors,
            prompt_tokens=F("prompt_tokens") + prompt,
            completion_tokens=F("completion_tokens") + completion,
        )
        if not updated:
            UsageDaily.objects.create(
                day=day,
                api_key_id=key_id,
                tenant_id=tenant_id,
                model=model,
                requests=requests,
                errors=errors,
                prompt_tokens=prompt,
                completion_tokens=completion,
            )


def _usage_insert(entries: list[tuple[bytes, ledger.UsageEvent]]) -> None:
    """Store events not stored before, with their daily totals, in the caller's transaction.

    Only one flush runs at a time (streams.drain's lock), so "not stored before" read here
    still holds when the rows are written, and a redelivered event is neither stored nor
    counted twice. A row that cannot be stored fails the batch; streams.drain then finds it.
    """
    fresh: dict[str, UsageRecord] = {}
    for _, event in entries:
        fresh.setdefault(event.request_id, _usage_row(event))
    stored = UsageRecord.objects.filter(request_id__in=list(fresh)).values_list(
        "request_id", flat=True
    )
    for request_id in stored:
        del fresh[request_id]
    rows = list(fresh.values())
    _check_constraints_now()
    UsageRecord.objects.bulk_create(rows)
    _usage_rollup(rows)


def usage_prune(*, older_than_days: int, batch_size: int = USAGE_PRUNE_BATCH) -> int:
    """Delete raw usage records past retention, in batches; daily totals are kept."""
    cutoff = timezone.now() - timedelta(days=older_than_days)
    deleted = 0
    while True:
        ids = list(
            UsageRecord.objects.filter(created_at__lt=cutoff).values_list("id", flat=True)[
                :batch_size
            ]
        )
        if not ids:
            return deleted
        deleted += UsageRecord.objects.filter(id__in=ids).delete()[0]


def _check_constraints_now() -> None:
    """Make PostgreSQL check foreign keys at insert, not at commit (Django defers them), so a
    row that refers to something deleted fails its own attempt even inside an outer
    transaction, and streams.drain can tell it from the rest of its batch."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")


def _usage_store(pairs: list[tuple[bytes, bytes]]) -> dict[bytes, str]:
    """Store usage events drained from the buffer; return why the unreadable ones are."""
    decoded = []
    unreadable = {}
    for entry_id, payload in pairs:
        try:
            decoded.append((entry_id, ledger.UsageEvent.decode(payload)))
        except (TypeError, ValueError) as exc:
            unreadable[entry_id] = f"unreadable usage event: {exc}"
    _usage_insert(decoded)
    return unreadable


def usage_replay(lines: Iterable[str]) -> tuple[int, int]:
    """Append the usage events gateways could only log (`usage-unrecorded <json>` lines, when
    Redis failed mid-request) to the usage stream again; returns (appended, unreadable).

    The flush stores each request once, so replaying an event that did arrive is harmless."""
    events, unreadable = [], 0
    for line in lines:
        _, mark, raw = _log_message(line).partition(ledger.UNRECORDED + " ")
        if not mark:
            continue  # any other log line
        try:
            events.append(ledger.UsageEvent.decode(raw.strip()))
        except (ValueError, TypeError):  # orjson's JSONDecodeError is a ValueError
            unreadable += 1
    pipe = request_redis().pipeline(transaction=False)
    for event in events:
        pipe.xadd(
            ledger.USAGE_STREAM.of_tenant(event.tenant_id).key(), {streams.FIELD: event.encode()}
        )
    pipe.execute()
    return len(events), unreadable


def _log_message(line: str) -> str:
    """The message of a log line: a JSON line's `message` field (DMX_LOG_FORMAT=json), else the
    line itself (plain text, whose message ends it). The JSON object may come after a prefix a
    log collector added (journalctl's date and unit, a container runtime's stream name)."""
    start = line.find("{")
    if start >= 0:
        with contextlib.suppress(ValueError, AttributeError, TypeError):
            message = orjson.loads(line[start:]).get("message")
            if message is not None:  # a plain line's first brace opens the usage event instead
                return str(message)
    return line


def usage_flush(
    *, shard: int | None = None, consumer: str = "flusher", batch_size: int = streams.BATCH
) -> int:
    """Move buffered usage events (of one shard's stream, or of all) into PostgreSQL; return
    how many left the buffer."""
    return streams.flush(
        ledger.USAGE_STREAM, _usage_store, shard=shard, consumer=consumer, batch_size=batch_size
    )
