"""The gates: how carefully a plan runs. One definition of each default, read by the executor, by the DAG forms
(``repair.params``) and by the plan (the form's values are part of its hash and its approval text).

A repair or a restore takes its gates from its form and records them in the plan (``gates_of``): the approver sees
them, and the run uses the plan's, whatever the form says later (``approved_gates``). A restore takes the same
gates, with no pause between brokers (``RESTORE_PAUSE_S``) and its ``timeout_s`` as the stop and start timeouts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from fleet_doctor.repair.progress import EVERY_S

# a restore puts back the state a repair found, broker by broker, usually to end an incident: the brokers' own
# health gates (ISR back, healthy polls) stand between them, a fixed wait would only lengthen it
RESTORE_PAUSE_S = 0.0
RESTORE_TIMEOUT_S = 600.0  # the restore form's timeout_s: per broker, stopped and registered again within


@dataclass(frozen=True)
class Gates:
    # the process gone and its /brokers/ids entry removed within (a controlled shutdown moves every partition
    # leadership away first: a broker leading thousands takes minutes); past it the broker counts as still stopping
    stop_timeout_s: float = 300.0
    start_timeout_s: float = 600.0  # registered again after its start within
    healthy_polls: int = 3  # consecutive polls with zero under-replicated partitions
    poll_interval_s: float = 10.0
    isr_timeout_s: float = 900.0  # per broker: back in ISR (and the healthy polls) within
    pause_between_brokers_s: float = 60.0  # a roll's: between its steps (a batch, or a broker alone)
    progress_every_s: float = EVERY_S  # a long wait writes its progress to the log at most this often
    # a roll's: a broker in RECOVERY (Kafka's BrokerState) is waited for this long at most (Strimzi never forces one);
    # a restarted broker leads its preferred partitions again within
    recovery_timeout_s: float = 6 * 3600.0
    leadership_timeout_s: float = 120.0
    # a roll's: a step that cannot go (an operator's hold, a gate: ``roll_status.GATES``) waits this long, why in the
    # log and on the fleet page, then the roll halts (nothing of the step stopped) until its task is cleared
    blocked_timeout_s: float = 1800.0

    @classmethod
    def from_params(cls, params: Mapping[str, Any], **fixed: Any) -> Gates:
        """The gates a DAG form's values give (a value the form leaves empty keeps its default), then ``fixed``."""
        given = {
            f.name: type(getattr(cls, f.name))(params[f.name])
            for f in fields(cls)
            if f.name in (*FORM_GATES, *ROLL_FORM_GATES) and params.get(f.name) is not None
        }
        return replace(cls(**given), **fixed)

    @classmethod
    def for_restore(cls, params: Mapping[str, Any]) -> Gates:
        """The restore's gates: the form's, no pause between brokers, ``timeout_s`` to stop and to register again."""
        timeout = float(params.get("timeout_s") or RESTORE_TIMEOUT_S)
        return cls.from_params(
            params, pause_between_brokers_s=RESTORE_PAUSE_S, stop_timeout_s=timeout, start_timeout_s=timeout
        )


# the form's values that set a gate (the others are fixed by the product)
FORM_GATES = ("healthy_polls", "poll_interval_s", "isr_timeout_s", "pause_between_brokers_s", "stop_timeout_s")
# the form's values that decide how carefully a repair runs: recorded in its plan (hash and approval text)
GATE_PARAMS = (*FORM_GATES, "min_insync_replicas", "dry_run", "allow_quorum_loss")
ONLY_WHEN_SET = frozenset({"allow_quorum_loss"})  # recorded only when true: plans without it read as before
# the roll form's gates besides the repair's, and what a roll plan records (its hash, its approval text)
ROLL_FORM_GATES = ("recovery_timeout_s", "leadership_timeout_s", "blocked_timeout_s")
ROLL_GATE_PARAMS = (*GATE_PARAMS, *ROLL_FORM_GATES)
# the restore form's: its timeout, the health gates and the static min ISR (recorded in the restore plan alike)
RESTORE_GATE_PARAMS = ("timeout_s", "healthy_polls", "poll_interval_s", "isr_timeout_s", "min_insync_replicas")
DEFAULTS = Gates()


def gates_of(params: Mapping[str, Any], keys: tuple[str, ...] = GATE_PARAMS) -> dict[str, Any]:
    """The form's values that decide how carefully the plan runs: part of the plan (its hash, its approval text).
    ``keys``: the repair's (``GATE_PARAMS``) or the restore's (``RESTORE_GATE_PARAMS``)."""
    return {k: params[k] for k in keys if params.get(k) is not None and (k not in ONLY_WHEN_SET or params[k])}


def approved_gates(plan_gates: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """The gates the approver saw (the plan's), over whatever the form holds."""
    return {**params, **dict(plan_gates)}


def static_min_isr(params: Mapping[str, Any], inventory_min_isr: int | None) -> int | None:
    """The brokers' static ``min.insync.replicas`` (server.properties) as the repair takes it: the form's
    ``min_insync_replicas`` or the inventory's, the larger (the form may raise the inventory's, never lower it);
    None when neither is set. Under ZooKeeper's cluster-wide default, over Kafka's 1: for the health gates
    (``session.cluster_for``) and the plan's risk line (``planner.default_min_isr``) alike."""
    form = int(params.get("min_insync_replicas") or 0)
    return max(form, inventory_min_isr or 0) or None
