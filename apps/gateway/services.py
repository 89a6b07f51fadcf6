"""The gateway's own data: the content filter's sensitive terms, and telling gateways to
reload it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import QuerySet
from django.db.models.functions import Lower
from django.utils import timezone

from apps.gateway.choices import SensitiveTermAction
from apps.gateway.content_filter import DEFAULT_CATEGORY
from apps.gateway.models import SensitiveTerm, StoredResponse
from apps.gateway.response_records import RESPONSES_STREAM, ResponseRecord
from apps.gateway.terms_csv import RowError, TermRow, read_terms
from apps.keys.models import Tenant
from dmxplatform import streams
from dmxplatform.audit.entries import audit_created, audited_update
from dmxplatform.records import storable_text
from dmxplatform.versioned import VersionCounter

# Gateways rebuild their content filter when this moves (GatewayRuntime.refresh).
CONTENT_FILTER_VERSION = VersionCounter("content_filter")


def content_filter_invalidate() -> None:
    """Tell every gateway to rebuild its content filter once the current transaction commits."""
    CONTENT_FILTER_VERSION.bump_on_commit()


def sensitive_term_create(
    *,
    term: str,
    category: str = DEFAULT_CATEGORY,
    action: SensitiveTermAction = SensitiveTermAction.BLOCK,
    is_active: bool = True,
) -> SensitiveTerm:
    sensitive_term = SensitiveTerm(
        term=term.strip(), category=category, action=action, is_active=is_active
    )
    sensitive_term.full_clean()
    sensitive_term.save()
    content_filter_invalidate()
    return sensitive_term


def sensitive_term_update(*, sensitive_term: SensitiveTerm) -> SensitiveTerm:
    """Save edits made to a term (admin) and tell the gateways."""
    sensitive_term.term = sensitive_term.term.strip()
    sensitive_term.full_clean()
    sensitive_term.save()
    content_filter_invalidate()
    return sensitive_term


def sensitive_term_delete(*, sensitive_term: SensitiveTerm) -> None:
    sensitive_term.delete()
    content_filter_invalidate()


def sensitive_term_bulk_delete(*, queryset: QuerySet[SensitiveTerm]) -> int:
    deleted, _ = queryset.delete()
    content_filter_invalidate()
    return deleted


def sensitive_term_bulk_set_active(*, queryset: QuerySet[SensitiveTerm], is_active: bool) -> int:
    changed = audited_update(queryset, is_active=is_active, updated_at=timezone.now())
    content_filter_invalidate()
    return changed


def sensitive_term_validate(*, term: SensitiveTerm) -> None:
    """Raise ValidationError if `term` cannot be stored, uniqueness aside: an import settles
    that for all its rows with one query rather than one per row."""
    term.full_clean(validate_unique=False, validate_constraints=False)


@transaction.atomic
def sensitive_term_import(
    *,
    terms: Iterable[str | TermRow],
    category: str = DEFAULT_CATEGORY,
    action: SensitiveTermAction = SensitiveTermAction.BLOCK,
    validated: bool = False,
) -> list[SensitiveTerm]:
    """Create the terms not stored yet (compared ignoring case) in one insert; return them.
    A plain string takes `category` and `action`, a TermRow its own; `validated` rows were
    checked by the caller (sensitive_term_validate) and are not checked again."""
    wanted: dict[str, SensitiveTerm] = {}
    for item in terms:
        row = TermRow(item, category, action) if isinstance(item, str) else item
        text = row.term.strip()
        if text and text.lower() not in wanted:
            wanted[text.lower()] = SensitiveTerm(
                term=text, category=row.category, action=row.action
            )
    existing = set(
        SensitiveTerm.objects.annotate(lowered=Lower("term"))
        .filter(lowered__in=list(wanted))
        .values_list("lowered", flat=True)
    )
    new = [term for lowered, term in wanted.items() if lowered not in existing]
    if not validated:
        for term in new:
            sensitive_term_validate(term=term)
    created = SensitiveTerm.objects.bulk_create(new)
    audit_created(created)  # bulk_create sends no signals
    if created:
        content_filter_invalidate()
    return created


@dataclass(frozen=True)
class TermsImported:
    created: list[SensitiveTerm]
    already_stored: int  # rows whose term exists (ignoring case), left as they are
    errors: list[RowError]  # rows not imported, and why


def sensitive_terms_import_csv(*, data: bytes) -> TermsImported:
    """Import a CSV file of terms (apps.gateway.terms_csv): the good rows are created, those
    stored already kept as they are, and each bad row is reported with its line, not raised."""
    rows, errors = read_terms(data)
    good: list[TermRow] = []
    for line, row in rows:
        candidate = SensitiveTerm(term=row.term, category=row.category, action=row.action)
        try:
            sensitive_term_validate(term=candidate)
        except ValidationError as error:
            problems = (f"{name}: {' '.join(texts)}" for name, texts in error.message_dict.items())
            errors.append(RowError(line, "; ".join(problems)))
        else:
            good.append(row)
    # Each row was checked above, with its line for the report.
    created = sensitive_term_import(terms=good, validated=True)
    distinct = len({row.term.lower() for row in good})
    return TermsImported(
        created=created,
        already_stored=distinct - len(created),
        errors=sorted(errors, key=lambda error: error.line),
    )


# Stored responses ------------------------------------------------------------------------------


def _stored_response_rows(pairs: list[tuple[bytes, bytes]]) -> dict[bytes, str]:
    """Store a drained batch of response records (dmxplatform.streams.Store). An id taken
    already is left as it is: the record stored before (an entry read twice), or one its tenant
    deleted while the entry waited (stored_response_delete)."""
    rows, unreadable = [], {}
    retention = timedelta(days=settings.DMX_RESPONSES_RETENTION_DAYS)
    for entry_id, payload in pairs:
        try:
            record = ResponseRecord.decode(payload)
            created_at = datetime.fromtimestamp(record.created_at, tz=UTC)
            rows.append(
                StoredResponse(
                    id=record.id,
                    tenant_id=record.tenant_id,
                    api_key_id=record.api_key_id or None,
                    created_at=created_at,
                    expires_at=created_at + retention,
                    status=record.status,
                    model=storable_text(str(record.response.get("model") or ""), 128),
                    background=record.background,
                    previous_response_id=record.response.get("previous_response_id") or "",
                    response=record.response,
                    input_items=record.input_items,
                    size_bytes=len(payload),
                )
            )
        except (TypeError, ValueError, KeyError) as exc:
            unreadable[entry_id] = f"unreadable stored response: {exc}"
    # A tenant deleted meanwhile takes its responses with it: the rows would have no owner.
    live = set(
        Tenant.objects.filter(id__in={row.tenant_id for row in rows}).values_list("id", flat=True)
    )
    StoredResponse.objects.bulk_create(
        [row for row in rows if row.tenant_id in live], ignore_conflicts=True
    )
    return unreadable


def stored_responses_flush(*, shard: int | None = None) -> int:
    """Move buffered response records (one shard's stream, or all) into the database."""
    return streams.flush(RESPONSES_STREAM, _stored_response_rows, shard=shard)


def stored_response_delete(*, record: ResponseRecord) -> None:
    """Empty a stored response's row and mark it deleted, inserting the marked row where the
    drain has not stored it yet, so that it never does (_stored_response_rows)."""
    created_at = datetime.fromtimestamp(record.created_at, tz=UTC)
    marker = StoredResponse(
        id=record.id,
        tenant_id=record.tenant_id,
        api_key_id=record.api_key_id or None,
        created_at=created_at,
        expires_at=created_at + timedelta(days=settings.DMX_RESPONSES_RETENTION_DAYS),
        status=record.status,
        response={},
        input_items=[],
        deleted_at=timezone.now(),
    )
    StoredResponse.objects.bulk_create(
        [marker],
        update_conflicts=True,
        unique_fields=["id"],
        update_fields=["response", "input_items", "size_bytes", "deleted_at"],
    )


def stored_responses_purge(*, now: datetime | None = None) -> int:
    """Delete the stored responses past their retention."""
    cutoff = now or timezone.now()
    return StoredResponse.objects.filter(expires_at__lte=cutoff).delete()[0]
