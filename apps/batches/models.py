"""Files and batches as OpenAI's API defines them, and a batch's lines, each run once.

A file's bytes live in the `batch_files` storage (settings.STORAGES: local files by default,
any S3-compatible store by setting), never in a row. A batch's lines are rows: what each asked,
how far it got and what it answered, so that the output and error files are written from them
once every line has ended, and a worker lost mid-run loses nothing.
"""

from __future__ import annotations

import secrets

from django.core.files.storage import storages
from django.db import models

from apps.batches.choices import BatchEndpoint, BatchStatus, FilePurpose, LineState


def _file_id() -> str:
    return f"file-{secrets.token_hex(12)}"


def _batch_id() -> str:
    return f"batch_{secrets.token_hex(12)}"


def _storage():
    return storages["batch_files"]


def _path(file: File, filename: str) -> str:
    # The tenant's own folder, the file's own id: no name a client sends reaches a path.
    return f"tenant-{file.tenant_id}/{file.id}.jsonl"


class File(models.Model):
    id = models.CharField(primary_key=True, max_length=40, default=_file_id, editable=False)
    tenant = models.ForeignKey("keys.Tenant", on_delete=models.CASCADE, related_name="files")
    api_key = models.ForeignKey(
        "keys.ApiKey", on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    purpose = models.CharField(max_length=32, choices=FilePurpose.choices)
    filename = models.CharField(max_length=255)
    bytes = models.PositiveBigIntegerField(default=0)
    content = models.FileField(storage=_storage, upload_to=_path, max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["tenant", "created_at"], name="file_tenant_time_idx")]

    def __str__(self) -> str:
        return self.id


class Batch(models.Model):
    id = models.CharField(primary_key=True, max_length=40, default=_batch_id, editable=False)
    tenant = models.ForeignKey("keys.Tenant", on_delete=models.CASCADE, related_name="batches")
    # Its lines run as this key: its limits, budgets and allowed models.
    api_key = models.ForeignKey("keys.ApiKey", on_delete=models.PROTECT, related_name="batches")
    # The address it was created from: its lines pass the key's allowed networks from there.
    client_address = models.CharField(max_length=64, blank=True)
    endpoint = models.CharField(max_length=32, choices=BatchEndpoint.choices)
    completion_window = models.CharField(max_length=8, default="24h")
    input_file = models.ForeignKey(File, on_delete=models.SET_NULL, null=True, related_name="+")
    output_file = models.ForeignKey(
        File, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    error_file = models.ForeignKey(
        File, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    status = models.CharField(
        max_length=16, choices=BatchStatus.choices, default=BatchStatus.VALIDATING
    )
    metadata = models.JSONField(null=True, blank=True)
    # Why validation refused the file: OpenAI's {"object": "list", "data": [...]}.
    errors = models.JSONField(null=True, blank=True)
    model = models.CharField(max_length=128, blank=True)
    total = models.PositiveIntegerField(default=0)
    completed = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    input_tokens = models.PositiveBigIntegerField(default=0)
    cached_tokens = models.PositiveBigIntegerField(default=0)
    output_tokens = models.PositiveBigIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    in_progress_at = models.DateTimeField(null=True, blank=True)
    finalizing_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)
    expired_at = models.DateTimeField(null=True, blank=True)
    cancelling_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)
    # The worker running it holds it until then (renewed while it runs): one at a time, and
    # another takes over once a lost worker's hold lapses.
    held_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name_plural = "batches"
        indexes = [
            models.Index(fields=["tenant", "created_at"], name="batch_tenant_time_idx"),
            models.Index(fields=["status"], name="batch_status_idx"),
        ]

    def __str__(self) -> str:
        return self.id


class BatchLine(models.Model):
    batch = models.ForeignKey(Batch, on_delete=models.CASCADE, related_name="lines")
    index = models.PositiveIntegerField(help_text="Its line in the input file, from 1.")
    custom_id = models.CharField(max_length=512, blank=True)
    url = models.CharField(max_length=32, blank=True)
    body = models.JSONField(null=True, blank=True)
    # Lines that share their prompt's start run one after another, to the node that caches it.
    prefix_key = models.CharField(max_length=16, blank=True)
    state = models.CharField(max_length=8, choices=LineState.choices, default=LineState.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    not_before = models.DateTimeField(null=True, blank=True)
    # The request id of its current try. A try its worker was lost in goes again under the same
    # id (resumed): should the lost try have settled, the ledger keeps one record of the two.
    request_id = models.CharField(max_length=64, blank=True)
    resumed = models.BooleanField(default=False)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    # The API's answer as it sent it: bytes, as a model's text may hold what PostgreSQL's JSON
    # cannot (a NUL), and the output file gives it back unchanged.
    response = models.BinaryField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["batch", "index"]
        constraints = [
            models.UniqueConstraint(fields=["batch", "index"], name="batch_line_unique"),
        ]
        indexes = [
            models.Index(fields=["batch", "state", "prefix_key"], name="batch_line_state_idx")
        ]

    def __str__(self) -> str:
        return f"{self.batch_id}#{self.index}"
