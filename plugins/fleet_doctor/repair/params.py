"""The repair and restore DAGs' forms and DAG arguments, as plain data the DAG files turn into ``Param``s (nothing
here imports Airflow): the gates' defaults come from ``repair.gates``, their one definition."""

from __future__ import annotations

from typing import Any

from fleet_doctor.repair.gates import DEFAULTS, RESTORE_TIMEOUT_S

MIN_ISR = {
    "default": None,
    "type": ["null", "integer"],
    "minimum": 1,
    "description": "the brokers' default (empty: the inventory's)",
}


def manual_dag_args() -> dict[str, Any]:
    """What the repair and restore DAGs share: triggered by hand only, one run at a time."""
    import pendulum

    start = pendulum.datetime(2026, 1, 1, tz="UTC")  # one run per cluster at a time (each cluster has its own DAG)
    return {"schedule": None, "start_date": start, "catchup": False, "max_active_runs": 1}


def _health_gates() -> dict[str, dict[str, Any]]:
    return {
        "healthy_polls": {
            "default": DEFAULTS.healthy_polls,
            "type": "integer",
            "minimum": 1,
            "description": "consecutive healthy polls per broker",
        },
        "poll_interval_s": {"default": int(DEFAULTS.poll_interval_s), "type": "integer", "minimum": 1},
        "isr_timeout_s": {
            "default": int(DEFAULTS.isr_timeout_s),
            "type": "integer",
            "minimum": 60,
            "description": "per broker: back in ISR within",
        },
    }


def repair_gates() -> dict[str, dict[str, Any]]:
    """The repair form's gates (``Param(**spec)`` each), in the form's order."""
    pause = {"default": int(DEFAULTS.pause_between_brokers_s), "type": "integer", "minimum": 0}
    dry_run = {
        "default": False,
        "type": "boolean",
        "title": "Dry run (nothing written)",
        "description": "Do every read and check and log every command, but write nothing: no backup, no file "
        "change, no broker stop, no ZooKeeper write. The approval then says DRY RUN.",
    }
    stop = {
        "default": int(DEFAULTS.stop_timeout_s),
        "type": "integer",
        "minimum": 30,
        "description": "per broker: its controlled shutdown done (process gone, unregistered) within; past it the "
        "repair halts with the lock held and the broker counted as still stopping",
    }
    quorum_loss = {
        "default": False,
        "type": "boolean",
        "title": "KRaft: allow losing the quorum",
        "description": "Only for a KRaft cluster of fewer than 3 voters: restarting a voter then leaves no majority "
        "until it is back (no metadata change, no new leader). Off: such a restart is refused. The approval says so.",
    }
    return {
        "pause_between_brokers_s": pause,
        **_health_gates(),
        "stop_timeout_s": stop,
        "dry_run": dry_run,
        "min_insync_replicas": MIN_ISR,
        "allow_quorum_loss": quorum_loss,
    }


def restore_gates() -> dict[str, dict[str, Any]]:
    """The restore form's gates (``Param(**spec)`` each), in the form's order."""
    timeout = {
        "default": int(RESTORE_TIMEOUT_S),
        "type": "integer",
        "minimum": 30,
        "description": "per broker: stop / register within",
    }
    return {"timeout_s": timeout, **_health_gates(), "min_insync_replicas": MIN_ISR}


def roll_params() -> dict[str, dict[str, Any]]:
    """The roll form (``Param(**spec)`` each), in the form's order: what and why, the batching, the gates."""
    from fleet_doctor.repair.roll_plan import BATCHING, ROLL_REASONS

    repair = repair_gates()
    repair["pause_between_brokers_s"] = dict(repair["pause_between_brokers_s"], description="between steps")
    return {
        "reason_kind": {"default": ROLL_REASONS[0], "type": "string", "enum": list(ROLL_REASONS)},
        "reason": {"default": "", "type": "string", "description": "what changes (free text, in the approval)"},
        "brokers": {"default": [], "type": "array", "description": "broker ids to roll (empty: every broker)"},
        "hold_out": {"default": [], "type": "array", "description": "broker ids not to restart"},
        "batching": {
            "default": BATCHING[0],
            "type": "string",
            "enum": list(BATCHING),
            "description": "partition-disjoint: brokers that share no partition restart together (by rack when "
            "every partition spans racks)",
        },
        "isr_margin": {
            "default": 0,
            "type": "integer",
            "minimum": 0,
            "description": "a batch keeps min.insync.replicas + this in every ISR",
        },
        "max_batch": {"default": 0, "type": "integer", "minimum": 0, "description": "brokers per batch (0: no cap)"},
        **repair,
        "recovery_timeout_s": {
            "default": int(DEFAULTS.recovery_timeout_s),
            "type": "integer",
            "minimum": 60,
            "description": "a broker recovering its logs is waited for this long",
        },
        "leadership_timeout_s": {
            "default": int(DEFAULTS.leadership_timeout_s),
            "type": "integer",
            "minimum": 5,
            "description": "per step: leadership back within",
        },
        "blocked_timeout_s": {
            "default": int(DEFAULTS.blocked_timeout_s),
            "type": "integer",
            "minimum": 0,
            "description": "a step held or blocked by a gate waits this long, then the roll halts",
        },
    }
