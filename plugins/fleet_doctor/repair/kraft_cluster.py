"""The health gates' view of a KRaft cluster (``cluster_health.ClusterHealth``): the committed metadata image, followed
from the controllers' metadata logs over SSH.

Where the facts come from, and why: the controllers' ``__cluster_metadata`` logs, read by the product's own decoder as
the audit reads them (``audit.kraft``), not Kafka's CLI tools. The decoder is already on every controller's path
(sent on stdin, nothing installed), it reads files the node has written whether its JVM answers or not, and it knows
the high watermark from the voters' logs themselves; Kafka's tools would need a client config with the cluster's
credentials on a node, a JVM start per poll (seconds) and a listener that answers, which is exactly what a broker
under repair may not have.

Only committed metadata counts. Every poll reads every voter's log end at once (``quorum.read_quorum``: a walk of the
newest segment's batch headers, no record decoded); the high watermark is the end a majority holds. The records are
then read from a voter holding it, up to it and no further (``cluster_metadata.metadata_records``): a tail one
controller wrote that the quorum does not hold is never a fact here.

Polls are cheap: the follower keeps its own image (``cluster_metadata.Image``, the decoder's own) and asks only for the
records after the last offset it applied, from the byte where the last read stopped; the controller decodes those
batches and nothing else. When the log no longer holds that offset (a snapshot let Kafka delete the segments), the
image is read whole again. Anything that cannot be read fails closed: ``GateUnreadable`` names what and why.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from fleet_doctor import cluster_metadata as cm
from fleet_doctor.audit import kraft
from fleet_doctor.cluster_health import ClusterHealth
from fleet_doctor.cluster_health import min_isr_value as _min_isr_value
from fleet_doctor.repair.errors import RepairError
from fleet_doctor.repair.quorum import QuorumView, impaired_refusal, read_quorum, restart_refusal

LOG = logging.getLogger(__name__)
# reads this close after the last round are of the same poll (a gate's partitions, then its brokers): one round serves
# them; the gates' polls and the quorum gate's rounds are further apart (at least half a second)
SAME_POLL_S = 0.25


class GateUnreadable(RepairError):
    """The gate could not read the cluster's committed state: it holds (fails closed), saying what it could not read."""


class MetadataFollower:
    """A KRaft cluster's committed metadata image, kept up to date from the voters' logs."""

    def __init__(self, endpoints: dict[int, dict[str, Any]], connect: kraft.Connect, expected: str | None) -> None:
        self.endpoints = endpoints
        self.sessions = kraft.Sessions(connect)  # one connection per voter, kept between polls (the quorum's too)
        self.expected = expected  # the cluster.id every voter read must name (the inventory's), when known
        self.cluster_id: str | None = None  # the cluster.id the voters' meta.properties name, as read
        self.image: cm.Image | None = None
        self.next_offset = 0  # the offset after the last committed record applied
        self.resume: tuple[int, list[int]] | None = None  # (controller, its decoder's resume point)
        self.reads = 0
        self.records = 0  # records applied in all, to measure what a poll costs

    def follow(self, view: QuorumView) -> None:
        """Bring the image up to the quorum's high watermark in ``view``; GateUnreadable when it cannot be."""
        hw = view.high_watermark
        if hw is None:
            unread = "; ".join(
                v.error or f"node {v.node_id}: not read" for v in view.voters if v.log_end_offset is None
            )
            raise GateUnreadable(
                f"fewer than a majority of the {len(view.voters)} voters could be read, so nothing is known to be "
                f"committed: {unread}"
            )
        if self.image is not None and self.next_offset >= hw:
            return
        holders = sorted(
            (v for v in view.voters if v.log_end_offset is not None and v.log_end_offset >= hw),
            key=lambda v: (v.node_id != view.leader, -(v.log_end_offset or 0)),
        )
        errors = []
        for v in holders:
            try:
                self._read(self.endpoints[v.node_id], hw)
                return
            except kraft.MetadataReadError as e:
                errors.append(str(e))
        raise GateUnreadable(
            f"the committed metadata (up to offset {hw}) could not be read from any voter holding it: "
            + ("; ".join(errors) or "none holds it")
        )

    def _read(self, endpoint: dict[str, Any], hw: int) -> None:
        cid = int(endpoint["controller_id"])
        resume = self.resume[1] if self.resume is not None and self.resume[0] == cid else None
        start = self.next_offset if self.image is not None else 0

        def read(client: Any) -> tuple[dict[str, Any], dict[str, Any], cm.Image, list[dict[str, Any]]]:
            fresh = cm.Image()  # per try: a read tried again on a new connection starts over
            follow: list[dict[str, Any]] = []

            def on_record(rec: dict[str, Any]) -> None:
                if start == 0:  # a whole image: streamed into a new one (a big cluster's is never kept twice)
                    fresh.replay(rec["name"], rec["fields"])
                else:  # a few records: applied once the read is whole, or not at all
                    follow.append(rec)

            head, end = kraft.read_records(client, endpoint, start, hw, on_record, resume=resume)
            return head, end, fresh, follow

        head, end, fresh, follow = self.sessions.read(endpoint, read)
        who = f"controller {cid}"
        known = self.expected or self.cluster_id
        if known is not None and head.get("cluster_id") not in (None, known):
            raise kraft.MetadataReadError(
                f"{who}: its metadata log names cluster.id {head.get('cluster_id')!r}, not {known!r}"
            )
        if not end.get("image_complete"):
            raise kraft.MetadataReadError(
                f"{who}: its committed metadata is not whole: {'; '.join(end.get('problems') or [])[:500]}"
            )
        if head.get("reset") and start != 0:  # the log no longer holds ``start``: read whole from the snapshot
            self.image, self.next_offset, self.resume = None, 0, None
            self._read(endpoint, hw)
            return
        if start == 0:
            self.image = fresh
        else:
            assert self.image is not None
            for rec in follow:
                err = self.image.replay(rec["name"], rec["fields"])
                if err:
                    LOG.warning("%s: offset %s: %s", who, rec.get("offset"), err)
        self.cluster_id = head.get("cluster_id") or self.cluster_id
        self.next_offset = int(end["next_offset"])
        self.resume = (cid, end["resume"]) if end.get("resume") else None
        self.reads += 1
        self.records += int(end.get("records") or 0)


class KraftCluster(ClusterHealth):
    """What the health gates read from a KRaft cluster: every call reads the quorum again and follows the log up to
    its high watermark (``refresh``), then answers from the committed image. ``default_min_isr``: the brokers'
    static ``min.insync.replicas`` (server.properties), below the metadata's ConfigRecords; ``allow_quorum_loss``:
    the approver accepted that restarting a voter of a quorum of fewer than 3 loses the quorum meanwhile."""

    registration = "unfenced registration in the metadata"

    def __init__(
        self,
        inventory: Any,
        connect: kraft.Connect | None = None,
        default_min_isr: int | None = None,
        *,
        allow_quorum_loss: bool = False,
    ) -> None:
        if default_min_isr is not None:
            _min_isr_value(default_min_isr, "default_min_isr")
        self.inventory = inventory
        self.default_min_isr = default_min_isr
        self.allow_quorum_loss = allow_quorum_loss
        self.connect = connect or kraft.airflow_connect
        self.endpoints = {c.id: inventory.controller_endpoint(c.id) for c in inventory.controllers}
        self.follower = MetadataFollower(self.endpoints, self.connect, inventory.cluster_id)
        self.view: QuorumView | None = None
        self.earlier: QuorumView | None = None
        self.refreshed_at = 0.0  # when the last round (the voters read, the image followed) ended

    # ---- reading
    def refresh(self) -> QuorumView:
        """Every voter's log end now, and the image followed up to the committed end; GateUnreadable otherwise."""
        view = read_quorum(list(self.endpoints.values()), sessions=self.follower.sessions)
        if view.problems:
            raise GateUnreadable(f"the quorum cannot be judged: {'; '.join(view.problems)}")
        self.follower.follow(view)
        self.earlier, self.view = self.view, view
        self.refreshed_at = time.monotonic()
        return view

    def current(self) -> QuorumView:
        """``refresh``, unless the last round ended less than ``SAME_POLL_S`` ago: the reads of one poll of the gates
        (``partitions``, then ``problems``' ``registered``) share one round of SSH reads. Counted from the end of the
        round (the image followed), not from the voters' read: following the image takes longer than ``SAME_POLL_S``
        itself, and counted from the read, every second read of a poll read all the voters again."""
        if self.view is not None and time.monotonic() - self.refreshed_at < SAME_POLL_S:
            return self.view
        return self.refresh()

    def close(self) -> None:
        """Close the connections to the voters kept between polls (``kraft.Sessions``)."""
        self.follower.sessions.close()

    def __enter__(self) -> KraftCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def image(self) -> cm.Image:
        if self.follower.image is None:
            self.current()
        assert self.follower.image is not None
        return self.follower.image

    def cluster_id(self) -> str | None:
        """The cluster.id the voters' metadata log dirs were formatted with (their ``meta.properties``)."""
        if self.follower.image is None:
            self.refresh()
        return self.follower.cluster_id

    # ---- ClusterHealth
    def registered(self) -> set[int]:
        """Brokers registered and unfenced: a stopped broker stays registered on KRaft, fenced."""
        self.current()
        return {int(b) for b, r in self.image.brokers.items() if not r.get("Fenced")}

    def racks(self) -> dict[int, str | None]:
        self.current()
        return {int(b): r.get("Rack") for b, r in self.image.brokers.items()}

    def fenced(self) -> set[int]:
        """Brokers registered and fenced (stopped, not heartbeating, or not caught up), as of the last refresh."""
        return {int(b) for b, r in self.image.brokers.items() if r.get("Fenced")}

    def controller(self) -> int | None:
        return self.current().leader

    def voters(self) -> frozenset[int]:
        return frozenset(self.endpoints)

    def config(self, kind: str, name: str | int | None) -> tuple[dict[str, Any], str]:
        if kind == "topic":
            key, where = (cm.CONFIG_TOPIC, str(name)), f"the metadata's ConfigRecord of topic {name}"
        elif name is None:
            key, where = (cm.CONFIG_BROKER, ""), "the metadata's cluster-wide broker ConfigRecord"
        else:
            key, where = (cm.CONFIG_BROKER, str(name)), f"the metadata's ConfigRecord of broker {name}"
        return dict(self.image.configs.get(key) or {}), where

    def partitions(self) -> list[dict[str, Any]]:
        self.current()
        resolved = self.resolver()
        out = []
        for _topic_id, t in sorted(self.image.topics.items(), key=lambda kv: kv[1]["name"]):
            for pid, p in sorted(t["partitions"].items()):
                out.append(self.partition(t["name"], pid, list(p["Replicas"]), list(p["Isr"]), p["Leader"], resolved))
        return out

    def restart_refusal(self, node_id: int) -> str | None:
        """The quorum's word on stopping ``node_id`` now: nothing while more than one voter is impaired; a voter
        only while the quorum stays healthy without it (``quorum.restart_refusal``). Judged on this read and the one
        before it (the caller polls: a voter is caught up when its log end moves)."""
        view = self.refresh()
        why = impaired_refusal(view, self.earlier)
        if why is None and node_id in self.endpoints:
            why = restart_refusal(view, node_id, self.earlier, allow_quorum_loss=self.allow_quorum_loss)
        return why
