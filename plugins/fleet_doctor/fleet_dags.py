"""The fleet as the DAG files see it: one set of DAGs per cluster of ``FLEET_DOCTOR_INVENTORY`` (docs/fleet.md).

Each cluster gets ``kafka_fleet_audit__<cluster>``, ``kafka_fleet_repair__<cluster>``,
``kafka_fleet_restore__<cluster>`` and ``kafka_fleet_purge__<cluster>`` (``fleet_doctor.airflow_links``). The
nightly audits of the clusters that set no schedule of their own are spread over a window
(``FLEET_DOCTOR_AUDIT_WINDOW`` minutes from the fleet's schedule), so fifty clusters do not start at 02:00
together; the audit pool is one for the fleet, and each cluster stages at most
its fair share of it at once. A cluster whose inventory is broken, or whose schedule is not one, is a problem of its
own (``InventoryProblem``, naming the file and the field): the other clusters' DAGs never depend on it.

Nothing here imports Airflow: the DAG files call ``fleet_clusters`` when they are parsed, the Kafka fleet view when
it lists the fleet.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from croniter import croniter

from fleet_doctor.airflow_links import audit_dag, purge_dag, repair_dag, restore_dag, roll_dag
from fleet_doctor.inventory import Inventory, InventoryProblem, load_fleet
from fleet_doctor.settings import Settings

# Airflow's cron presets (airflow.timetables._cron) that name one time a period: a spread shifts their minute
PRESETS = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@quarterly": "0 0 1 */3 *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}
MIN_STAGE_SLOTS = 4  # a cluster's floor of the audit pool, however many clusters share it


@dataclass(frozen=True)
class ClusterDags:
    """One cluster's DAGs: their ids, the audit's schedule and the cluster's share of the audit pool."""

    cluster: str
    metadata_mode: str
    schedule: str | None  # the audit's (the repair and the restore are manual)
    stage_slots: int  # stage tasks of one audit run at once (the pool bounds the fleet's)
    source: str  # the inventory file
    inventory: Inventory = field(repr=False, compare=False)

    @property
    def audit(self) -> str:
        return audit_dag(self.cluster)

    @property
    def repair(self) -> str:
        return repair_dag(self.cluster)

    @property
    def restore(self) -> str:
        return restore_dag(self.cluster)

    @property
    def purge(self) -> str:
        return purge_dag(self.cluster)

    @property
    def roll(self) -> str:
        return roll_dag(self.cluster)

    def tags(self, kind: str) -> list[str]:
        """The DAG's tags: the product, its kind, the cluster and its metadata mode (the DAG list filters on them)."""
        return ["kafka", "fleet-doctor", kind, f"cluster:{self.cluster}", self.metadata_mode]


@dataclass(frozen=True)
class FleetDags:
    clusters: list[ClusterDags]  # by cluster name
    problems: list[InventoryProblem]  # the inventory files that give no DAGs, and why


def cron_of(schedule: str) -> str:
    """A schedule as a five-field cron expression (a preset expanded). ValueError when it is not one."""
    expression = PRESETS.get(schedule.strip(), schedule.strip())
    if expression.startswith("@") or len(expression.split()) != 5 or not croniter.is_valid(expression):
        raise ValueError(f"{schedule!r} is not a cron expression (five fields) or a preset such as @daily")
    return expression


def spread(schedule: str, index: int, count: int, window_min: int) -> str:
    """The fleet's schedule for the ``index``-th of ``count`` clusters: shifted by ``index * window / count`` minutes
    when it names one minute and one hour (``30 2 * * *``, ``@daily``); the first cluster keeps it as it is. A shift
    past midnight wraps to the same day's early hours when every day field is ``*``; otherwise it stops at 23:59 (the
    day fields stay true). Any other schedule (several hours, steps, ranges) is kept as it is."""
    expression = cron_of(schedule)
    minute, hour, *days = expression.split()
    if count <= 1 or window_min <= 0 or not (minute.isdigit() and hour.isdigit()):
        return schedule
    start = int(hour) * 60 + int(minute)
    offset = index * window_min // count
    at = (start + offset) % 1440 if days == ["*", "*", "*"] else min(start + offset, 1439)
    return " ".join([str(at % 60), str(at // 60), *days])


def fair_share(pool_slots: int, clusters: int) -> int:
    """Stage tasks one cluster's audit runs at once: twice its even share of the pool (audits rarely all overlap),
    at least ``MIN_STAGE_SLOTS``, at most the pool."""
    return max(1, min(pool_slots, max(MIN_STAGE_SLOTS, 2 * pool_slots // max(clusters, 1))))


def fleet_clusters(settings: Settings) -> FleetDags:
    """The fleet's clusters and their DAGs' shape. InventoryError when ``FLEET_DOCTOR_INVENTORY`` itself cannot be
    read (no such file or directory)."""
    fleet = load_fleet(settings.inventory)
    problems = list(fleet.problems)
    usable: list[Inventory] = []
    for name, inv in fleet.clusters.items():
        if inv.schedule is not None:
            try:
                cron_of(inv.schedule)
            except ValueError as e:
                problems.append(InventoryProblem(str(fleet.sources[name]), f"{fleet.sources[name]}: schedule: {e}"))
                continue
        usable.append(inv)
    try:
        cron_of(settings.schedule)
        fleet_schedule_ok = True
    except ValueError:
        fleet_schedule_ok = False  # not spread: Airflow says what is wrong with it
    spread_over = [inv.cluster for inv in usable if inv.schedule is None]
    share = settings.stage_slots or fair_share(settings.pool_slots, len(usable))
    out = []
    for inv in usable:
        if inv.schedule is not None:
            schedule = inv.schedule
        elif fleet_schedule_ok:
            schedule = spread(settings.schedule, spread_over.index(inv.cluster), len(spread_over), settings.window_min)
        else:
            schedule = settings.schedule
        out.append(
            ClusterDags(
                cluster=inv.cluster,
                metadata_mode=inv.metadata_mode,
                schedule=schedule,
                stage_slots=min(share, settings.pool_slots),
                source=str(fleet.sources[inv.cluster]),
                inventory=inv,
            )
        )
    return FleetDags(out, sorted(problems, key=lambda p: p.path))
