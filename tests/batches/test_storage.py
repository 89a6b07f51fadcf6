"""Batch files in an S3-compatible store, the way production keeps them: DMX_FILES_STORAGE set to
django-storages' S3 backend. The S3 here is a stand-in (moto answers botocore's calls in this
process): no S3-compatible server runs on this machine."""

from __future__ import annotations

import json

import boto3
import pytest
from django.core.files.storage import storages
from moto import mock_aws

from apps.batches import services
from apps.batches.choices import BatchStatus, LineState
from apps.batches.models import BatchLine, File
from tests.batches.factories import finished_batch, request_line
from tests.keys.factories import make_api_key

pytestmark = pytest.mark.django_db
BUCKET = "dmx-files"


@pytest.fixture
def s3_files(settings, monkeypatch):
    """The `batch_files` storage on S3, as the setting makes it; the model's field resolved its
    storage when the app loaded, so it is pointed at the new one too."""
    with mock_aws():
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket=BUCKET)
        settings.STORAGES = {
            **settings.STORAGES,
            "batch_files": {
                "BACKEND": "storages.backends.s3.S3Storage",
                "OPTIONS": {"bucket_name": BUCKET, "region_name": "us-east-1"},
            },
        }
        storage = storages["batch_files"]
        monkeypatch.setattr(File._meta.get_field("content"), "storage", storage)
        yield boto3.client("s3", region_name="us-east-1")


def test_a_batch_reads_its_input_from_s3_and_writes_its_output_there(s3_files):
    key, _ = make_api_key()
    batch = finished_batch(key)
    assert batch.status == BatchStatus.COMPLETED
    assert BatchLine.objects.get(batch=batch).state == LineState.DONE
    name = batch.input_file.content.name
    stored = s3_files.get_object(Bucket=BUCKET, Key=name)["Body"].read()
    assert json.loads(stored) == request_line("a") and name.startswith(f"tenant-{key.tenant_id}/")
    output = s3_files.get_object(Bucket=BUCKET, Key=batch.output_file.content.name)
    assert json.loads(output["Body"].read())["response"]["body"] == {"id": "chatcmpl-1"}

    services.file_delete(batch.input_file)
    listed = s3_files.list_objects_v2(Bucket=BUCKET).get("Contents", [])
    assert [item["Key"] for item in listed] == [batch.output_file.content.name]
