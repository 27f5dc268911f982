"""The Kafka fleet view's FastAPI app, mounted by ``plugins/kafka_fleet_plugin.py`` at ``/kafka-fleet`` in Airflow's
api-server. Routes (relative to the mount):

- ``GET /``: the fleet overview, one row per cluster the user may read (its audit DAG), worst first, and the
  inventory files that give no cluster.
- ``GET /clusters/<cluster>/``: the cluster's page (``?runs=N``: the trend over the last N runs, default 30).
- ``GET /clusters/<cluster>/repair?rule=..&broker=..&topic=..``: the cluster's repair DAG's trigger form,
  pre-filled (repeatable params; also ``include_internal``, ``dry_run``, ``audit_run``). Airflow 3.3.2 has no URL
  that opens its own Trigger form pre-filled (docs/console.md).
- ``GET /clusters/<cluster>/reports/<run>.html``: a published audit report, read from the cluster's store (only
  runs its history names).
- ``GET /metrics``: the fleet's health in Prometheus' text format (``console.metrics``), the readable clusters'.
- ``GET /repair``, ``GET /reports/<run>.html``: the links of reports and alerts made before there were fleets,
  sent on to the one cluster's page (a fleet of one); with more clusters, a 404 that says to name the cluster.

Airflow does not authenticate a plugin's app: a cluster's routes depend on ``read`` (the plugin passes a check that
the user may read the cluster's audit DAG), its repair page also on ``repair`` (its repair DAG); the overview shows
the clusters ``readable`` allows. Every response carries a Content-Security-Policy that lets only the page's own
nonce'd scripts run."""

from __future__ import annotations

import datetime as dt
import secrets
from collections.abc import Callable, Mapping, Sequence
from urllib.parse import quote

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.params import Depends as DependsParam
from fastapi.responses import HTMLResponse, PlainTextResponse, RedirectResponse

from fleet_doctor import layout
from fleet_doctor.airflow_links import RepairScope, audit_dag
from fleet_doctor.console import render
from fleet_doctor.console.data import ClusterRow, cluster_row, load_view, read_lock, read_roll
from fleet_doctor.console.metrics import CONTENT_TYPE, render_metrics
from fleet_doctor.fleet_dags import ClusterDags, FleetDags, fleet_clusters
from fleet_doctor.inventory import InventoryError
from fleet_doctor.settings import Settings, SettingsError
from fleet_doctor.store import Store, StoreError

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
Readable = Callable[[str], bool]  # may the user read this DAG?


def _html(text: str, csp: str, status_code: int = 200) -> HTMLResponse:
    return HTMLResponse(text, status_code=status_code, headers={**HEADERS, "Content-Security-Policy": csp})


def everyone() -> Readable:
    """The overview's default check (no Airflow): every cluster is shown."""
    return lambda dag_id: True


def create_app(
    settings: Callable[[], Settings] = Settings.from_env,
    read: Sequence[DependsParam] = (),
    repair: Sequence[DependsParam] = (),
    readable: Callable[..., Readable] = everyone,
    pending_approvals: Callable[[], Mapping[str, int]] | None = None,
) -> FastAPI:
    """The app. ``settings`` is called per request (the store's settings and the inventories may change without a
    restart); ``read`` guards a cluster's routes, ``repair`` its repair page as well; ``readable``, a dependency,
    says which clusters' audit DAGs the user may read (the overview and the metrics show those);
    ``pending_approvals()``: the approvals waiting for a person, per cluster (the metrics; the plugin reads Airflow's
    database)."""
    app = FastAPI(title="Kafka fleet", docs_url=None, redoc_url=None, openapi_url=None)

    def fleet_of() -> tuple[Settings, FleetDags]:
        try:
            s = settings()
            return s, fleet_clusters(s)
        except (SettingsError, InventoryError) as err:
            raise StoreError(f"the fleet's settings or inventory cannot be read: {err}") from err

    def cluster_of(name: str) -> tuple[ClusterDags, Store]:
        """The cluster and its store; 404 when the fleet has no such cluster, 503 when the store is unreadable."""
        try:
            s, fleet = fleet_of()
            found = next((c for c in fleet.clusters if c.cluster == name), None)
            if found is None:
                raise HTTPException(404, f"no cluster {name!r} in the fleet")
            return found, s.for_cluster(name).store
        except StoreError as err:
            raise HTTPException(503, str(err)) from err

    def fleet_rows(may_read: Readable, now: dt.datetime) -> tuple[list[ClusterRow], FleetDags, int]:
        """The rows of the clusters the user may read, the fleet, and how many clusters were left out."""
        s, fleet = fleet_of()
        shown = [c for c in fleet.clusters if may_read(audit_dag(c.cluster))]
        rows = [cluster_row(c.inventory, c.schedule, lambda c=c: s.for_cluster(c.cluster).store, now) for c in shown]
        return rows, fleet, len(fleet.clusters) - len(shown)

    @app.get("/", response_class=HTMLResponse)
    def overview(may_read: Readable = Depends(readable)) -> HTMLResponse:
        nonce = secrets.token_urlsafe(16)
        now = dt.datetime.now(dt.UTC)
        try:
            rows, fleet, hidden = fleet_rows(may_read, now)
        except StoreError as err:
            return _html(render.error_page(str(err), nonce), render_csp(nonce), 503)
        page = render.overview_page(rows, fleet.problems, nonce, hidden=hidden, now=now)
        return _html(page, render_csp(nonce))

    @app.get("/metrics", response_class=PlainTextResponse)
    def metrics(may_read: Readable = Depends(readable)) -> PlainTextResponse:
        """The fleet's health in Prometheus' text format, for the clusters the caller may read (a scrape
        authenticates with a bearer token, as Airflow's API does: docs/fleet.md, "Metrics")."""
        try:
            rows, fleet, _ = fleet_rows(may_read, dt.datetime.now(dt.UTC))
        except StoreError as err:
            raise HTTPException(503, str(err)) from err
        waiting = pending_approvals() if pending_approvals else None
        text = render_metrics(rows, fleet.problems, waiting)
        return PlainTextResponse(text, media_type=CONTENT_TYPE, headers={"Cache-Control": "no-store"})

    @app.get("/clusters/{cluster}/", response_class=HTMLResponse, dependencies=list(read))
    def cluster_page(cluster: str, runs: int = Query(30, ge=1, le=30)) -> HTMLResponse:
        nonce = secrets.token_urlsafe(16)
        try:
            _, store = cluster_of(cluster)
            view = load_view(store)
        except (StoreError, HTTPException) as err:
            message = err.detail if isinstance(err, HTTPException) else str(err)
            code = err.status_code if isinstance(err, HTTPException) else 503
            return _html(render.error_page(str(message), nonce, cluster), render_csp(nonce), code)
        lock, lock_error = read_lock(store)
        page = render.fleet_page(
            view, nonce, cluster=cluster, last=runs, lock=lock, lock_error=lock_error, roll=read_roll(store)
        )
        return _html(page, render_csp(nonce))

    @app.get("/clusters/{cluster}/repair", response_class=HTMLResponse, dependencies=[*read, *repair])
    def repair_form(cluster: str, request: Request) -> HTMLResponse:
        cluster_of(cluster)
        nonce = secrets.token_urlsafe(16)
        scope, problems = RepairScope.from_query(request.query_params.multi_items())
        return _html(render.repair_page(scope, problems, nonce, cluster=cluster), render_csp(nonce))

    @app.get("/clusters/{cluster}/reports/{name}", response_class=HTMLResponse, dependencies=list(read))
    def report(cluster: str, name: str) -> HTMLResponse:
        run = name.removesuffix(".html")
        if run == name:
            raise HTTPException(404, f"{name}: not a report (reports/<run>.html)")
        _, store = cluster_of(cluster)
        try:
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

    def the_only_cluster(may_read: Readable) -> str:
        try:
            _, fleet = fleet_of()
        except StoreError as err:
            raise HTTPException(503, str(err)) from err
        names = [c.cluster for c in fleet.clusters]
        if len(names) != 1 or not may_read(audit_dag(names[0])):
            raise HTTPException(404, "the fleet has several clusters: open the page at clusters/<cluster>/")
        return names[0]

    @app.get("/repair")
    def old_repair(request: Request, may_read: Readable = Depends(readable)) -> RedirectResponse:
        """A repair link from before there were fleets (a report, an alert): the one cluster's repair page."""
        query = f"?{request.url.query}" if request.url.query else ""
        return RedirectResponse(f"clusters/{quote(the_only_cluster(may_read), safe='')}/repair{query}", 307)

    @app.get("/reports/{name}")
    def old_report(name: str, may_read: Readable = Depends(readable)) -> RedirectResponse:
        # relative to /kafka-fleet/reports/: one level up is the mount
        return RedirectResponse(
            f"../clusters/{quote(the_only_cluster(may_read), safe='')}/reports/{quote(name, safe='')}", 307
        )

    return app


def render_csp(nonce: str) -> str:
    return PAGE_CSP.format(nonce=nonce)
