"""The web dashboard mounted in the project (``ops/board/`` in urls.py), behind Django's staff login."""

from __future__ import annotations

import io
import re
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.db import connections
from django.http import HttpResponse
from django.test import Client, override_settings

import syncjobs.contrib.django as sj
from syncjobs.contrib.django import conf
from syncjobs.web.access import CSRF_COOKIE
from tests.django_project.shop import jobs

pytestmark = [pytest.mark.django_db(transaction=True, databases=list(settings.DATABASES)), pytest.mark.timeout(60)]

BASE = "/ops/board"
#: Every URL a page of the dashboard names: links, forms, its script and stylesheet, the live part.
#: The URLs a page links to or loads (a data: URL, the empty favicon, is in the page itself: none).
URL_ATTRIBUTES = re.compile(r'\b(?:href|action|src|data-refresh)="(?!data:)([^"]*)"')


def run_worker() -> None:
    call_command("syncjobs_worker", "--burst", stdout=io.StringIO())


def dead_job(alias: str, number: str = "nowhere") -> str:
    """A dead letter: an order that does not exist is Fatal at its first run."""
    job_id = sj.get_queue().dispatch(jobs.ConfirmOrder(number=number, database=alias))
    run_worker()
    assert state_of(job_id) == "dead"
    return job_id


def state_of(job_id: str) -> str:
    status = sj.get_queue().status(job_id)
    assert status is not None
    return status.state


def signed_in(*, staff: bool) -> Client:
    client = Client()
    client.force_login(User.objects.create_user("someone", "someone@example.com", "pw", is_staff=staff))
    return client


def text(response: HttpResponse) -> str:
    return response.content.decode()


def post(client: Client, path: str, form: dict[str, str], **extra: str) -> HttpResponse:
    """A POST as a browser sends the dashboard's forms (urlencoded: the test client's default is multipart)."""
    response: HttpResponse = client.post(
        path, urlencode(form), content_type="application/x-www-form-urlencoded", **extra
    )
    return response


def csrf_field(page: str) -> str:
    match = re.search(r'name="csrf" value="([^"]*)"', page)
    assert match is not None, "no csrf field on the page"
    return match[1]


def test_an_anonymous_visitor_is_sent_to_the_admin_login_and_changes_nothing(alias: str) -> None:
    job_id = dead_job(alias)
    client = Client()
    response = client.get(f"{BASE}/jobs", {"state": "dead"})
    assert response.status_code == 302
    target = urlsplit(response["Location"])
    assert target.path == "/admin/login/"
    assert parse_qs(target.query) == {"next": [f"{BASE}/jobs?state=dead"]}

    response = post(client, f"{BASE}/jobs/{job_id}/retry", {"csrf": "made-up"}, HTTP_COOKIE=f"{CSRF_COOKIE}=made-up")
    assert response.status_code == 302
    assert state_of(job_id) == "dead"


def test_a_signed_in_user_who_is_not_staff_gets_403_and_changes_nothing(alias: str) -> None:
    job_id = dead_job(alias)
    client = signed_in(staff=False)
    response = client.get(f"{BASE}/")
    assert response.status_code == 403
    assert 'class="brand"' not in text(response)  # Django's 403, not a page of the dashboard
    # A token of its own in the cookie and the form would pass the dashboard's CSRF check: the staff check comes first.
    client.cookies[CSRF_COOKIE] = "made-up"
    assert post(client, f"{BASE}/jobs/{job_id}/retry", {"csrf": "made-up"}).status_code == 403
    assert state_of(job_id) == "dead"


def test_staff_see_the_overview_of_the_table_the_integrations_queue_uses(alias: str) -> None:
    sj.dispatch(jobs.ConfirmOrder(number="A-1", database=alias), queue="mail")
    client = signed_in(staff=True)
    response = client.get(f"{BASE}/")
    assert response.status_code == 200
    page = text(response)
    assert 'data-queue="mail"' in page
    # The database the queue works on: this alias's test database, its table the migration's.
    assert f"{connections[alias].settings_dict['NAME']} · table {conf.TABLE}" in page
    # The dashboard's security headers pass through Django's middleware unchanged.
    assert response["Content-Security-Policy"].startswith("default-src 'self'")
    assert response["X-Frame-Options"] == "DENY"
    assert response["Cache-Control"] == "no-store"
    assert response["Content-Type"] == "text/html; charset=utf-8"
    # Its CSRF cookie is one of the response's cookies, on the dashboard's path, its attributes kept.
    cookie = response.cookies[CSRF_COOKIE]
    assert cookie.value
    assert (cookie["path"], cookie["httponly"], cookie["samesite"]) == (BASE, True, "Strict")


def test_every_url_on_the_pages_is_under_the_mount_and_answers(alias: str) -> None:
    job_id = dead_job(alias)
    client = signed_in(staff=True)
    seen: set[str] = set()
    for page in (f"{BASE}/", f"{BASE}/jobs/{job_id}", f"{BASE}/jobs/{job_id}/retry"):
        response = client.get(page)
        assert response.status_code == 200, page
        urls = URL_ATTRIBUTES.findall(text(response))
        assert urls, page
        assert [url for url in urls if not url.startswith(f"{BASE}/")] == [], page
        seen.update(url.replace("&amp;", "&") for url in urls)
    assert f"{BASE}/static/dashboard.js" in seen
    assert f"{BASE}/jobs/{job_id}/retry" in seen
    for url in sorted(seen):  # a GET changes nothing: actions are POSTs from their confirm pages
        path, _, query = url.partition("?")
        response = client.get(path, parse_qs(query))
        assert response.status_code == 200, url
    # The jobs list, filtered by a link of the overview: the dead job in it.
    assert job_id in text(client.get(f"{BASE}/jobs", {"state": "dead", "queue": "default"}))


#: What ``startproject`` puts in MIDDLEWARE (and Django 6's CSP middleware): Django's CSRF check among them.
PROJECT_MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.csp.ContentSecurityPolicyMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]


@override_settings(MIDDLEWARE=PROJECT_MIDDLEWARE, SECURE_CSP={"default-src": ["'none'"]})
def test_django_csrf_check_leaves_the_dashboards_forms_to_its_own_and_its_headers_stay(alias: str) -> None:
    job_id = dead_job(alias)
    client = Client(enforce_csrf_checks=True)
    client.force_login(User.objects.create_user("someone", "someone@example.com", "pw", is_staff=True))
    confirm = client.get(f"{BASE}/jobs/{job_id}/retry")
    assert confirm["Content-Security-Policy"].startswith("default-src 'self'")  # not the project's policy
    assert post(client, f"{BASE}/jobs/{job_id}/retry", {}).status_code == 403  # the dashboard's own check
    assert state_of(job_id) == "dead"
    response = post(client, f"{BASE}/jobs/{job_id}/retry", {"csrf": csrf_field(text(confirm))})
    assert response.status_code == 303
    assert state_of(job_id) == "queued"


def test_under_a_script_name_the_links_and_cookies_carry_it_too(alias: str) -> None:
    client = signed_in(staff=True)
    response = client.get(f"{BASE}/", SCRIPT_NAME="/site")
    assert response.status_code == 200
    urls = URL_ATTRIBUTES.findall(text(response))
    assert urls
    assert [url for url in urls if not url.startswith(f"/site{BASE}/")] == []
    assert response.cookies[CSRF_COOKIE]["path"] == f"/site{BASE}"


def test_a_job_page_shows_its_payload_and_error_escaped(alias: str) -> None:
    job_id = dead_job(alias, number="<script>alert(1)</script>")
    response = signed_in(staff=True).get(f"{BASE}/jobs/{job_id}")
    assert response.status_code == 200
    page = text(response)
    assert "&quot;number&quot;: &quot;&lt;script&gt;alert(1)&lt;/script&gt;&quot;" in page  # the payload
    assert "fatal: no order &lt;script&gt;alert(1)&lt;/script&gt;" in page  # the error
    assert "<script>alert" not in page


def test_staff_retry_a_dead_job_through_the_confirm_page(alias: str) -> None:
    job_id = dead_job(alias)
    client = signed_in(staff=True)
    assert f'href="{BASE}/jobs/{job_id}/retry"' in text(client.get(f"{BASE}/jobs/{job_id}"))
    confirm = text(client.get(f"{BASE}/jobs/{job_id}/retry"))
    assert f'action="{BASE}/jobs/{job_id}/retry"' in confirm
    response = post(client, f"{BASE}/jobs/{job_id}/retry", {"csrf": csrf_field(confirm)})
    assert response.status_code == 303
    assert response["Location"] == f"{BASE}/jobs/{job_id}?done=retried"
    assert state_of(job_id) == "queued"
    status = sj.get_queue().status(job_id)
    assert status is not None
    assert status.attempts == 0  # fresh attempts
    assert "Queued again with fresh attempts." in text(client.get(response["Location"]))


def test_staff_cancel_a_waiting_job(alias: str) -> None:
    job_id = str(sj.dispatch(jobs.ConfirmOrder(number="later", database=alias), delay=3600))
    client = signed_in(staff=True)
    confirm = text(client.get(f"{BASE}/jobs/{job_id}/cancel"))
    response = post(client, f"{BASE}/jobs/{job_id}/cancel", {"csrf": csrf_field(confirm)})
    assert response.status_code == 303
    assert response["Location"] == f"{BASE}/jobs/{job_id}?done=cancelled"
    assert state_of(job_id) == "cancelled"


def test_a_post_without_the_dashboards_csrf_token_or_from_elsewhere_is_refused(alias: str) -> None:
    job_id = dead_job(alias)
    client = signed_in(staff=True)
    token = csrf_field(text(client.get(f"{BASE}/jobs/{job_id}/retry")))
    action = f"{BASE}/jobs/{job_id}/retry"
    without = post(client, action, {})
    assert without.status_code == 403
    assert "CSRF check" in text(without)
    assert post(client, action, {"csrf": "not-" + token}).status_code == 403
    # The right token from another site's page: its Origin is not the host Django sees.
    assert post(client, action, {"csrf": token}, HTTP_ORIGIN="https://evil.example").status_code == 403
    assert state_of(job_id) == "dead"
    # From the dashboard's own origin, as Django sees the host: done.
    response = post(client, action, {"csrf": token}, HTTP_ORIGIN="http://testserver")
    assert response.status_code == 303
    assert state_of(job_id) == "queued"


def test_the_memory_backend_has_no_table_to_show() -> None:
    client = signed_in(staff=True)
    with (
        override_settings(SYNCJOBS={"BACKEND": "memory"}),
        pytest.raises(ImproperlyConfigured, match=r"memory backend .*set \"DATABASE\" or \"URL\""),
    ):
        client.get(f"{BASE}/")
