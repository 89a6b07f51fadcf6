"""Sensitive terms in and out of the admin as CSV: good rows imported, bad rows reported by line
(never a server error), an export that imports back into the same terms; operators only."""

from __future__ import annotations

import csv
import io

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from apps.gateway.models import SensitiveTerm
from apps.gateway.services import (
    CONTENT_FILTER_VERSION,
    sensitive_term_create,
    sensitive_terms_import_csv,
)
from apps.gateway.terms_csv import MAX_CSV_BYTES, TermRow, read_terms, write_terms
from dmxplatform.redis_client import sync_redis
from tests.keys.factories import make_staff

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("private_redis")]

IMPORT = "/admin/gateway/sensitiveterm/import/"
LIST = "/admin/gateway/sensitiveterm/"


@pytest.fixture
def operator(client):
    client.force_login(make_staff("operator"))
    return client


def upload(client, content: bytes, name: str = "terms.csv"):
    return client.post(IMPORT, {"file": SimpleUploadedFile(name, content)}, follow=True)


def stored() -> set[tuple[str, str, str]]:
    return set(SensitiveTerm.objects.values_list("term", "category", "action"))


def test_a_good_file_is_imported_with_each_rows_category_and_action(
    operator, django_capture_on_commit_callbacks
):
    sensitive_term_create(term="Already")
    version = int(sync_redis().get(CONTENT_FILTER_VERSION.key) or 0)
    content = (
        "term,category,action\nphishing kit,abuse,block\n身份证号, pii ,MASK\nalready,x,flag\n"
    )
    with django_capture_on_commit_callbacks(execute=True):
        response = upload(operator, ("\ufeff" + content).encode())  # a spreadsheet's BOM
    assert response.status_code == 200
    assert "Imported 2 term(s); 1 stored already." in response.content.decode()
    assert stored() == {
        ("Already", "default", "block"),
        ("phishing kit", "abuse", "block"),
        ("身份证号", "pii", "mask"),
    }
    assert int(sync_redis().get(CONTENT_FILTER_VERSION.key)) == version + 1


def test_bad_rows_are_reported_by_line_and_the_good_ones_imported(operator):
    content = (
        "fine,abuse,flag\n"
        "***,abuse,block\n"  # nothing to match
        "other,abuse,shout\n"  # no such action
        f"{'x' * 101},abuse,block\n"  # too long
        "a,b,c,d\n"  # too many cells
        "\n"
        "last one\n"  # category and action default
    )
    page = upload(operator, content.encode()).content.decode()
    assert "Imported 2 term(s)" in page
    for line in (2, 3, 4, 5):
        assert f"Not imported, line {line}:" in page
    assert "shout" in page and "is not a valid choice" in page
    assert stored() == {("fine", "abuse", "flag"), ("last one", "default", "block")}


@pytest.mark.parametrize(
    "content",
    [b"\xff\xfe t\x00e\x00r\x00m\x00", b'"unterminated\n' + b"x" * (200 * 1024), b""],
)
def test_a_file_that_is_not_csv_text_is_reported_not_a_server_error(operator, content):
    response = upload(operator, content)
    assert response.status_code == 200
    assert not SensitiveTerm.objects.exists()


def test_a_file_over_the_limit_is_refused_whole():
    report = sensitive_terms_import_csv(data=b"term\n" + b"x,abuse\n" * (MAX_CSV_BYTES // 8 + 1))
    assert not report.created and "MB" in str(report.errors[0])


def test_the_export_imports_back_into_the_same_terms(operator):
    sensitive_term_create(term="alpha, with a comma", category="abuse", action="mask")
    sensitive_term_create(term='say "quoted"', category="pii", action="flag")
    sensitive_term_create(term="敏感词")
    before = stored()
    exported = operator.get(f"{LIST}export/")
    assert exported["Content-Type"].startswith("text/csv")
    assert exported.content.decode().splitlines()[0] == "term,category,action"
    SensitiveTerm.objects.all().delete()
    assert "Imported 3 term(s)" in upload(operator, exported.content).content.decode()
    assert stored() == before


def test_the_selected_terms_export_as_csv(operator):
    kept = sensitive_term_create(term="chosen", category="abuse")
    sensitive_term_create(term="left out")
    response = operator.post(LIST, {"action": "export_csv", "_selected_action": [kept.id]})
    assert response.content.decode().splitlines() == ["term,category,action", "chosen,abuse,block"]


def test_a_viewer_can_neither_import_nor_export(client):
    client.force_login(make_staff("viewer"))
    sensitive_term_create(term="secret list")
    assert "Import CSV" not in client.get(LIST).content.decode()
    response = client.post(IMPORT, {"file": SimpleUploadedFile("t.csv", b"sneaky\n")})
    assert response.status_code == 403
    assert client.get(f"{LIST}export/").status_code == 403
    term = SensitiveTerm.objects.get()
    selected = client.post(LIST, {"action": "export_csv", "_selected_action": [term.id]})
    assert not selected["Content-Type"].startswith("text/csv")
    assert not SensitiveTerm.objects.filter(term="sneaky").exists()


FORMULAS = ['=HYPERLINK("http://x")', "+1+1", "-2+3", "@SUM(A1)", "\tcmd", "\rcmd"]


@pytest.mark.parametrize("term", FORMULAS)
def test_a_term_a_spreadsheet_would_run_is_exported_as_text(term):
    _, cells = csv.reader(io.StringIO(write_terms([TermRow(term, category=term)])))
    assert cells == ["'" + term, "'" + term, "block"]


@pytest.mark.parametrize(
    "term", [*FORMULAS, "'=already quoted", "''-twice", "'", "it's fine", "'quoted'", "a=b"]
)
def test_every_term_reads_back_as_it_was_written(term):
    rows, errors = read_terms(write_terms([TermRow(term, category=f"c{term}")]).encode())
    assert not errors
    assert [row for _, row in rows] == [TermRow(term, category=f"c{term}")]


def test_a_term_that_needs_no_quote_is_written_as_it_is():
    exported = write_terms([TermRow("it's fine"), TermRow("'quoted'"), TermRow("a=b")])
    assert exported.splitlines()[1:] == [
        "it's fine,default,block",
        "'quoted',default,block",
        "a=b,default,block",
    ]


def test_formula_terms_export_as_text_and_import_back_into_the_same_terms(operator):
    for term in ("=1+1", "-drop", "@mention", "+plus", "'=quoted already"):
        sensitive_term_create(term=term, category="=cat")
    before = stored()
    exported = operator.get(f"{LIST}export/").content.decode()
    for line in exported.splitlines()[1:]:
        assert line.startswith("'") and ",'=cat," in line
    SensitiveTerm.objects.all().delete()
    assert "Imported 5 term(s)" in upload(operator, exported.encode()).content.decode()
    assert stored() == before
