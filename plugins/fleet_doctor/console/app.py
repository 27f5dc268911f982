"""The Kafka fleet view's FastAPI app, mounted by ``plugins/kafka_fleet_plugin.py`` at ``/kafka-fleet`` in Airflow's
api-server. Routes (relative to the mount):

- ``GET /``: the fleet page (``?runs=N``: the trend over the last N runs, default 30).
- ``GET /repair?rule=..&broker=..&topic=..``: the repair DAG's trigger form, pre-filled (repeatable params;
  also ``include_internal``, ``dry_run``, ``audit_run``). Airflow 3.3.2 has no URL that opens its own Trigger form
  pre-filled (docs/console.md).
- ``GET /reports/<run>.html``: a published audit report, read from the store (only runs the history names).

Airflow does not authenticate a plugin's app: every route depends on ``read`` (the plugin passes Airflow's
``requires_access_dag``), the repair page also on ``repair``. Every response carries a Content-Security-Policy
that lets only the page's own nonce'd scripts run."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from typing import Any

from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.params import Depends
from fastapi.responses import HTMLResponse

from fleet_doctor import layout
from fleet_doctor.airflow_links import RepairScope
from fleet_doctor.console import render
from fleet_doctor.console.data import load_view
from fleet_doctor.settings import Settings, SettingsError
from fleet_doctor.store import StoreError

# the pages: their own nonce'd scripts and Airflow's REST API (same origin); framed only by Airflow itself
PAGE_CSP = (
    "default-src 'none'; script-src 'nonce-{nonce}'; style-src 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'self'"
)
# a stored report: no script of its own, only the view's link handler (nonce'd); anyone who can write the store can
# plant HTML in it, so it may not submit a form anywhere (form-action, and a sandbox without allow-forms) nor run a
# script of its own (the nonce). The sandbox keeps the origin (allow-same-origin): the link handler opens Airflow's
# pages in the Airflow window through its history, which a frame with an opaque origin may not touch
REPORT_CSP = (
    "default-src 'none'; script-src 'nonce-{nonce}'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'self'; sandbox allow-scripts allow-same-origin allow-popups "
    "allow-popups-to-escape-sandbox"
)
HEADERS = {"X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin", "Cache-Control": "no-store"}


def _html(text: str, csp: str, status_code: int = 200) -> HTMLResponse:
    return HTMLResponse(text, status_code=status_code, headers={**HEADERS, "Content-Security-Policy": csp})


def create_app(
    settings: Callable[[], Settings] = Settings.from_env,
    read: Sequence[Depends] = (),
    repair: Sequence[Depends] = (),
) -> FastAPI:
    """The app. ``settings`` is called per request (the store's settings may change without a restart);
    ``read`` guards every route, ``repair`` the repair page as well."""
    app = FastAPI(title="Kafka fleet", docs_url=None, redoc_url=None, openapi_url=None, dependencies=list(read))

    def store_of() -> Any:
        try:
            return settings().store
        except (SettingsError, StoreError) as err:
            raise StoreError(f"the audit's data store is not configured: {err}") from err

    @app.get("/", response_class=HTMLResponse)
    def fleet(runs: int = Query(30, ge=1, le=30)) -> HTMLResponse:
        nonce = secrets.token_urlsafe(16)
        try:
            view = load_view(store_of())
        except StoreError as err:
            return _html(render.error_page(str(err), nonce), PAGE_CSP.format(nonce=nonce), 503)
        return _html(render.fleet_page(view, nonce, last=runs), PAGE_CSP.format(nonce=nonce))

    @app.get("/repair", response_class=HTMLResponse, dependencies=list(repair))
    def repair_form(request: Request) -> HTMLResponse:
        nonce = secrets.token_urlsafe(16)
        scope, problems = RepairScope.from_query(request.query_params.multi_items())
        return _html(render.repair_page(scope, problems, nonce), PAGE_CSP.format(nonce=nonce))

    @app.get("/reports/{name}", response_class=HTMLResponse)
    def report(name: str) -> HTMLResponse:
        run = name.removesuffix(".html")
        if run == name:
            raise HTTPException(404, f"{name}: not a report (reports/<run>.html)")
        try:
            store = store_of()
            runs = {str(r.get("audit_run")) for r in store.read_jsonl(layout.HISTORY_RUNS)}
            if run not in runs:
                raise HTTPException(404, f"no audit run {run!r} in {store.url(layout.HISTORY_RUNS)}")
            text = store.read_text(layout.report_html(run))
        except StoreError as err:
            raise HTTPException(503, str(err)) from err
        if text is None:
            raise HTTPException(404, f"{store.url(layout.report_html(run))}: no such report in the store")
        nonce = secrets.token_urlsafe(16)  # the report's links into Airflow open in the Airflow window
        return _html(render.with_nav(text, nonce), REPORT_CSP.format(nonce=nonce))

    return app
