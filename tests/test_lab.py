"""The fleet lab against the real things: sshd per broker, ZooKeeper 3.8, the lab broker daemons.

Every check reads files, znodes, /proc and sockets itself; nothing trusts what the lab says it did.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paramiko
import pytest

from fleet_doctor import inventory as inv
from fleet_doctor.probe import (
    DEFAULT_SEGMENT_INDEX_BYTES,
    SUFFIXED_DIR_RE,
    parse_leader_epoch_checkpoint,
    parse_offset_checkpoint,
    parse_partition_metadata,
    walk_log,
)
from fleet_lab import fleet
from harness.kafka_ref import ref_valid_bytes
from harness.ssh import ssh_client

REPO = Path(__file__).resolve().parents[1]
FLEET_LAB = REPO / "bin" / "fleet-lab"

pytestmark = pytest.mark.timeout(300)


def fleet_lab(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([str(FLEET_LAB), *args], capture_output=True, text=True, timeout=240)
    if check and r.returncode != 0:
        raise AssertionError(f"fleet-lab {' '.join(args)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    return r


def processes_mentioning(needle: str) -> list[tuple[int, str]]:
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            st = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in cmd and st != "Z":
            out.append((int(pid), cmd))
    return out


def listening_hosts(port: int) -> set[str]:
    """Local addresses with a socket listening on ``port`` (from /proc/net/tcp and tcp6)."""
    hosts = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            addr, p = local.split(":")
            if state == "0A" and int(p, 16) == port:
                hosts.add(addr[-8:] if addr.startswith("0000000000000000FFFF0000") else addr)  # v4-mapped v6
    return hosts


LOOPBACK = "0100007F"  # 127.0.0.1 in /proc/net/tcp byte order


@pytest.fixture(scope="module")
def lab3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    d = tmp_path_factory.mktemp("lab") / "lab3"
    fleet_lab("up", "--dir", str(d), "--brokers", "3", "--log-dirs-per-broker", "2")
    try:
        yield json.loads(fleet_lab("status", "--dir", str(d), "--json").stdout)
    finally:
        fleet_lab("down", "--dir", str(d), check=False)


def zk_client(status: dict[str, Any]) -> Any:
    from kazoo.client import KazooClient

    zk = KazooClient(hosts=status["zookeeper"], timeout=10)
    zk.start(timeout=10)
    return zk


def ssh(entry: inv.BrokerEntry, command: str, host_key: str | None = None) -> tuple[int, str]:
    """Run a command on a broker over its sshd with the inventory's pinned host key."""
    client = ssh_client(entry, host_key)
    try:
        _, stdout, stderr = client.exec_command(command, timeout=120)
        out = stdout.read().decode() + stderr.read().decode()
        return stdout.channel.recv_exit_status(), out
    finally:
        client.close()


def state_of(zk: Any, topic: str, p: int) -> dict[str, Any]:
    return json.loads(zk.get(f"/brokers/topics/{topic}/partitions/{p}/state")[0])


# --------------------------------------------------------------------------------------------
def test_status_reports_endpoints_and_everything_binds_loopback(lab3: dict[str, Any]) -> None:
    assert set(lab3) >= {"zookeeper", "inventory", "brokers"}
    assert [b["id"] for b in lab3["brokers"]] == [1, 2, 3]
    zk_port = int(lab3["zookeeper"].split(":")[1].split("/")[0])
    assert listening_hosts(zk_port) == {LOOPBACK}
    for b in lab3["brokers"]:
        assert b["running"] and b["pid"] and b["ssh_host"] == "127.0.0.1"
        assert listening_hosts(b["ssh_port"]) == {LOOPBACK}
        assert listening_hosts(int(b["listener"].rsplit(":", 1)[1])) == {LOOPBACK}
        assert len(b["log_dirs"]) == 2 and all(Path(d).is_dir() for d in b["log_dirs"])
        assert Path(f"/proc/{b['pid']}").exists()


def test_zookeeper_holds_the_state_a_kafka_cluster_writes(lab3: dict[str, Any]) -> None:
    zk = zk_client(lab3)
    try:
        ids = sorted(int(i) for i in zk.get_children("/brokers/ids"))
        assert ids == [1, 2, 3]
        for i in ids:
            data, stat = zk.get(f"/brokers/ids/{i}")
            reg = json.loads(data)
            assert stat.ephemeralOwner != 0  # ephemeral, like KafkaZkClient.registerBroker
            assert reg["endpoints"] and reg["version"] == 5  # IBP >= 2.7 writes v5
        controller, cstat = zk.get("/controller")
        assert cstat.ephemeralOwner != 0 and json.loads(controller)["brokerid"] in ids
        assert int(zk.get("/controller_epoch")[0]) >= 1
        assert json.loads(zk.get("/cluster/id")[0])["id"]
        topics = zk.get_children("/brokers/topics")
        assert {"orders", "payments", "__consumer_offsets", "my-topic"} <= set(topics)
        for t in topics:
            znode = json.loads(zk.get(f"/brokers/topics/{t}")[0])
            assert znode["version"] == 3 and znode["topic_id"]
            for p, replicas in znode["partitions"].items():
                st = state_of(zk, t, int(p))
                assert st["leader"] in replicas and sorted(st["isr"]) == sorted(replicas)
        mytopic = json.loads(zk.get("/brokers/topics/my-topic")[0])
        assert mytopic["topic_id"] == "KheAqUg2T_C_ZwEhjgxjzw"  # the corpus cluster's own topic ID
    finally:
        zk.stop()


def test_log_dirs_are_kafka_files_with_replicas_and_corpus_data(lab3: dict[str, Any], corpus: Path) -> None:
    zk = zk_client(lab3)
    try:
        topic_ids = {t: json.loads(zk.get(f"/brokers/topics/{t}")[0]) for t in zk.get_children("/brokers/topics")}
    finally:
        zk.stop()
    seen: dict[str, set[int]] = {}
    for b in lab3["brokers"]:
        for d in map(Path, b["log_dirs"]):
            assert (d / ".lock").exists() and not (d / ".kafka_cleanshutdown").exists()  # running
            meta = (d / "meta.properties").read_text()
            assert f"broker.id={b['id']}" in meta
            entries, _ = parse_offset_checkpoint((d / "recovery-point-offset-checkpoint").read_bytes(), "rp")
            for pdir in sorted(p for p in d.iterdir() if p.is_dir()):
                topic, _, part = pdir.name.rpartition("-")
                seen.setdefault(pdir.name, set()).add(b["id"])
                assert b["id"] in topic_ids[topic]["partitions"][part]
                pm = parse_partition_metadata((pdir / "partition.metadata").read_bytes(), "pm")
                assert pm["topic_id"] == topic_ids[topic]["topic_id"]
                parse_leader_epoch_checkpoint((pdir / "leader-epoch-checkpoint").read_bytes(), "lec")
                logs = sorted(pdir.glob("*.log"))
                for log in logs[:-1]:
                    data = log.read_bytes()
                    assert ref_valid_bytes(data) == len(data)
                    res = walk_log(str(log), int(log.name[:20]), verify_crc=True)
                    assert res["crc_errors"] == 0 and res["crc_checked"] > 0
                    assert (pdir / (log.name[:20] + ".index")).stat().st_size < DEFAULT_SEGMENT_INDEX_BYTES
                active = logs[-1].name[:20]
                # a running broker has its active segment's indexes preallocated (AbstractIndex.resize)
                assert (pdir / f"{active}.index").stat().st_size == DEFAULT_SEGMENT_INDEX_BYTES
                assert (pdir / f"{active}.timeindex").stat().st_size == DEFAULT_SEGMENT_INDEX_BYTES - 4
                assert any(e[0] == topic and e[1] == int(part) for e in entries)
    assert seen["orders-0"] == {1, 2, 3}  # replicas on several brokers
    for p in range(3):  # the genuine corpus partitions, byte for byte
        src = corpus / "zk-3.9-3broker-thillai" / "kafka-logs-0" / f"my-topic-{p}" / "00000000000000000000.log"
        copies = [
            Path(d) / f"my-topic-{p}" / "00000000000000000000.log"
            for b in lab3["brokers"]
            for d in b["log_dirs"]
            if (Path(d) / f"my-topic-{p}").exists()
        ]
        assert len(copies) == 3 and all(c.read_bytes() == src.read_bytes() for c in copies)


def test_inventory_and_airflow_connections(lab3: dict[str, Any]) -> None:
    inventory = inv.load(lab3["inventory"])
    assert inventory.zookeeper == lab3["zookeeper"]
    assert [b.id for b in inventory.brokers] == [1, 2, 3]
    for b, s in zip(inventory.brokers, lab3["brokers"], strict=True):
        assert (
            b.ssh_port == s["ssh_port"]
            and b.log_dirs == s["log_dirs"]
            and set(b.service) == {*inv.SERVICE_COMMANDS, *inv.OPTIONAL_SERVICE_COMMANDS}
        )
    conns = json.loads(Path(lab3["airflow_connections"]).read_text())
    c = conns[inventory.ssh_connection_id(1)]
    assert c["conn_type"] == "ssh" and c["port"] == inventory.broker(1).ssh_port
    assert c["extra"]["host_key"] == inventory.broker(1).host_key and c["extra"]["no_host_key_check"] is False
    assert conns[inventory.zookeeper_connection_id]["extra"]["connect"] == inventory.zookeeper


def test_inventory_validation_names_the_problem(tmp_path: Path) -> None:
    good = {
        "inventory_version": 1,
        "cluster": "c1",
        "zookeeper": "zk:2181",
        "brokers": [
            {
                "id": 1,
                "host": "b1",
                "ssh_port": 22,
                "ssh_user": "kafka",
                "ssh_key_file": "/k",
                "kafka_version": "3.6.2",
                "host_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE",
                "log_dirs": ["/var/lib/kafka"],
                "service": {
                    "stop": "sudo systemctl stop kafka",
                    "start": "sudo systemctl start kafka",
                    "status": "systemctl is-active kafka",
                },
            }
        ],
    }
    assert inv.parse(good).broker(1).service_command("stop") == "sudo systemctl stop kafka"
    bad_cases = {
        "host": ("b1; rm -rf /", "invalid host"),
        "log_dirs": (["relative/dir"], "absolute paths"),
        "host_key": ("AAAA", "pinned public host key"),
        "service": ({"stop": "x", "start": ""}, "service.start"),
        "tmp_dir": ("/tmp/x; rm -rf /", "tmp_dir"),
    }
    assert inv.parse(good).broker(1).tmp_dir == "/tmp"  # the default
    for name, value in (("host", "b1\n"), ("host_key", good["brokers"][0]["host_key"] + "\n"), ("tmp_dir", "/a/../b")):
        data = json.loads(json.dumps(good))
        data["brokers"][0][name] = value  # a trailing newline passed the old `$` patterns
        with pytest.raises(inv.InventoryError):
            inv.parse(data)
    with pytest.raises(inv.InventoryError, match="cluster name"):
        inv.parse({**good, "cluster": "c1\n"})
    for field, (value, message) in bad_cases.items():
        data = json.loads(json.dumps(good))
        data["brokers"][0][field] = value
        with pytest.raises(inv.InventoryError, match=message):
            inv.parse(data)
    p = tmp_path / "inv.json"
    p.write_text("{not json")
    with pytest.raises(inv.InventoryError, match=str(p)):
        inv.load(p)


def test_stop_start_and_kill_over_ssh(lab3: dict[str, Any]) -> None:
    inventory = inv.load(lab3["inventory"])
    b = inventory.broker(2)
    zk = zk_client(lab3)
    try:
        rc, out = ssh(b, b.service_command("status"))
        assert rc == 0 and "running" in out
        rc, out = ssh(b, b.service_command("stop"))
        assert rc == 0, out
        assert zk.exists("/brokers/ids/2") is None  # deregistered with its session
        assert ssh(b, b.service_command("status"))[0] == 3
        for d in map(Path, b.log_dirs):
            assert (d / ".kafka_cleanshutdown").exists()
            for idx in d.glob("*/*.index"):  # trimmed by the clean stop
                assert idx.stat().st_size < DEFAULT_SEGMENT_INDEX_BYTES
        for t in ("orders", "payments"):  # the controller moved leadership and ISR off the stopped broker
            for p in range(3):
                st = state_of(zk, t, p)
                assert st["leader"] != 2 and 2 not in st["isr"]
        rc, out = ssh(b, b.service_command("start"))
        assert rc == 0, out
        assert zk.exists("/brokers/ids/2") is not None
        fleet.wait_healthy(fleet.LabState.load(Path(lab3["dir"])), timeout=30)
        assert all(not (Path(d) / ".kafka_cleanshutdown").exists() for d in b.log_dirs)
        # kill -9 over SSH: nothing trimmed, no marker; the ephemeral znode goes with the session timeout
        rc, out = ssh(b, b.service_command("stop").replace(" stop", " kill"))
        assert rc == 0, out
        assert ssh(b, b.service_command("status"))[0] == 3
        for d in map(Path, b.log_dirs):
            assert not (d / ".kafka_cleanshutdown").exists()
            assert any(i.stat().st_size == DEFAULT_SEGMENT_INDEX_BYTES for i in d.glob("*/*.index"))
        rc, out = ssh(b, b.service_command("start"))  # recovers and comes back
        assert rc == 0, out
        fleet.wait_healthy(fleet.LabState.load(Path(lab3["dir"])), timeout=30)
        log = (Path(lab3["dir"]) / "broker-2" / "server.log").read_text()
        assert "Recovering unflushed segment" in log
    finally:
        zk.stop()


def test_listener_port_taken_fails_start_like_kafka_and_frees_the_dirs(lab3: dict[str, Any]) -> None:
    """Kafka's SocketServer cannot bind: FATAL in the log, the service start fails with that line, the
    log dir locks are released, and once the port is free the broker starts again."""
    inventory = inv.load(lab3["inventory"])
    b = inventory.broker(3)
    port = next(x.listener_port for x in fleet.LabState.load(Path(lab3["dir"])).brokers if x.id == 3)
    assert ssh(b, b.service_command("stop"))[0] == 0
    squatter = socket.socket()
    try:
        squatter.bind(("127.0.0.1", port))
        squatter.listen(1)
        rc, out = ssh(b, b.service_command("start"))
        assert rc == 1
        assert f"Socket server failed to bind to 127.0.0.1:{port}" in out
        assert "Fatal error during KafkaServer startup" in out
    finally:
        squatter.close()
    rc, out = ssh(b, b.service_command("start"))
    assert rc == 0, out
    fleet.wait_healthy(fleet.LabState.load(Path(lab3["dir"])), timeout=30)


def test_foreign_directory_in_a_log_dir_fails_start_like_kafka(lab3: dict[str, Any]) -> None:
    """Kafka refuses to start on a directory in a log dir that is not a partition dir (the lost+found trap);
    a directory inside a partition dir is skipped (where a repair's quarantine lives)."""
    inventory = inv.load(lab3["inventory"])
    b = inventory.broker(3)
    log_dir = Path(b.log_dirs[0])
    inside = next(p for p in sorted(log_dir.iterdir()) if p.is_dir()) / "fleet-doctor-quarantine" / "x"
    assert ssh(b, b.service_command("stop"))[0] == 0
    (log_dir / "lost+found").mkdir()
    try:
        rc, out = ssh(b, b.service_command("start"))
        assert rc == 1
        assert f"Found directory {log_dir / 'lost+found'}, 'lost+found' is not in the form of topic-partition" in out
    finally:
        (log_dir / "lost+found").rmdir()
    inside.mkdir(parents=True)
    try:
        rc, out = ssh(b, b.service_command("start"))
        assert rc == 0, out
        fleet.wait_healthy(fleet.LabState.load(Path(lab3["dir"])), timeout=30)
    finally:
        inside.rmdir()
        inside.parent.rmdir()


def test_ssh_rejects_a_host_key_other_than_the_pinned_one(lab3: dict[str, Any]) -> None:
    inventory = inv.load(lab3["inventory"])
    other = inventory.broker(3).host_key
    with pytest.raises(paramiko.SSHException):
        ssh(inventory.broker(1), "true", host_key=other)


def test_controller_failover_elects_a_new_controller(lab3: dict[str, Any]) -> None:
    zk = zk_client(lab3)
    try:
        epoch = int(zk.get("/controller_epoch")[0])
        fleet_lab("inject", "controller-failover", "--dir", lab3["dir"])
        assert int(zk.get("/controller_epoch")[0]) == epoch + 1
        data, stat = zk.get("/controller")
        assert stat.ephemeralOwner != 0 and json.loads(data)["brokerid"] in (1, 2, 3)
    finally:
        zk.stop()


def test_old_client_add_partitions_drops_the_topic_id(lab3: dict[str, Any]) -> None:
    zk = zk_client(lab3)
    try:
        before = json.loads(zk.get("/brokers/topics/payments")[0])
        fleet_lab(
            "inject", "old-client-add-partitions", "--topic", "payments", "--partitions", "5", "--dir", lab3["dir"]
        )
        after = json.loads(zk.get("/brokers/topics/payments")[0])
        assert after["version"] == 1 and "topic_id" not in after and before["topic_id"]
        assert sorted(after["partitions"], key=int) == ["0", "1", "2", "3", "4"]
        state = fleet.LabState.load(Path(lab3["dir"]))
        fleet.wait_healthy(state, timeout=20)
        for p in ("3", "4"):
            for b in after["partitions"][p]:
                dirs = [Path(d) / f"payments-{p}" for d in state.broker(b).log_dirs]
                created = [d for d in dirs if d.is_dir()]
                assert len(created) == 1 and not (created[0] / "partition.metadata").exists()
        # a later failover mints a new ID (KAFKA-14190): drift ahead for the old replicas
        fleet_lab("inject", "controller-failover", "--dir", lab3["dir"])
        minted = json.loads(zk.get("/brokers/topics/payments")[0])["topic_id"]
        assert minted and minted != before["topic_id"]
    finally:
        zk.stop()


FILE_CHECKS = {
    "index-bad-size": lambda r: Path(r["paths"][0]).stat().st_size % 8 != 0,
    "index-orphan": lambda r: (
        all(Path(p).exists() for p in r["paths"]) and not Path(r["paths"][0]).with_suffix(".log").exists()
    ),
    "index-missing": lambda r: not Path(r["paths"][0]).exists() and Path(r["paths"][0]).with_suffix(".log").exists(),
    "segment-leftover": lambda r: all(Path(p).name.endswith(".deleted") and Path(p).exists() for p in r["paths"]),
    "log-torn-tail": lambda r: ref_valid_bytes(Path(r["paths"][0]).read_bytes()) < Path(r["paths"][0]).stat().st_size,
    "log-crc": lambda r: walk_log(r["paths"][0], r["segment"], verify_crc=True)["crc_errors"] == 1,
    "partition-metadata-malformed": lambda r: _raises(parse_partition_metadata, r["paths"][0]),
    "leader-epoch-malformed": lambda r: _raises(parse_leader_epoch_checkpoint, r["paths"][0]),
    "checkpoint-malformed": lambda r: _raises(parse_offset_checkpoint, r["paths"][0]),
    "stray-dir": lambda r: (
        (m := SUFFIXED_DIR_RE.match(Path(r["paths"][0]).name)) is not None
        and m.group("state") == "delete"
        and any(Path(r["paths"][0]).glob("*.log"))
    ),
}


def _raises(parser: Any, path: str) -> bool:
    try:
        parser(Path(path).read_bytes(), path)
    except ValueError:
        return True
    return False


@pytest.mark.parametrize("incident", sorted(FILE_CHECKS))
def test_file_incident_leaves_the_state_it_claims(lab3: dict[str, Any], incident: str) -> None:
    names = sorted(FILE_CHECKS)
    partition = names.index(incident) % 4  # clickstream has 4 partitions: spread the damage
    broker = 1 + names.index(incident) % 3
    r = fleet_lab(
        "inject",
        incident,
        "--topic",
        "clickstream",
        "--partition",
        str(partition),
        "--broker",
        str(broker),
        "--dir",
        lab3["dir"],
        "--json",
        check=False,
    )
    if r.returncode == 2 and "no replica" in r.stderr:  # clickstream has RF 2: not every broker hosts every partition
        r = fleet_lab(
            "inject", incident, "--topic", "clickstream", "--broker", str(broker), "--dir", lab3["dir"], "--json"
        )
    assert r.returncode == 0, r.stderr
    rec = json.loads(r.stdout)
    assert rec["incident"] == incident and rec["rule"] and rec["paths"] and rec["mechanism"]
    assert all(p.startswith(lab3["dir"]) for p in rec["paths"])
    assert FILE_CHECKS[incident](rec), rec


def test_up_down_leave_no_process_and_labs_run_side_by_side(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    fleet_lab("up", "--dir", str(a), "--brokers", "1")
    try:
        fleet_lab("up", "--dir", str(b), "--brokers", "2", "--kafka-version", "2.5.1")
        sa = json.loads(fleet_lab("status", "--dir", str(a), "--json").stdout)
        sb = json.loads(fleet_lab("status", "--dir", str(b), "--json").stdout)
        assert sa["zookeeper"] != sb["zookeeper"]
        assert all(x["running"] for x in sa["brokers"] + sb["brokers"])
        assert processes_mentioning(str(a)) and processes_mentioning(str(b))
        assert fleet_lab("up", "--dir", str(a), check=False).returncode == 2  # already up: refused
    finally:
        fleet_lab("down", "--dir", str(b), check=False)
        fleet_lab("down", "--dir", str(a), check=False)
    assert processes_mentioning(str(a)) == [] and processes_mentioning(str(b)) == []
    st = json.loads(fleet_lab("status", "--dir", str(a), "--json").stdout)
    assert not st["zookeeper_running"] and not any(x["running"] or x["ssh_running"] for x in st["brokers"])


@pytest.mark.parametrize(
    ("version", "behaviour"),
    [("1.1.1", "rebuild"), ("2.2.2", "rebuild"), ("3.6.2", "trust"), ("2.5.1", "trust")],
)
def test_corrupt_index_at_start_per_kafka_version(tmp_path: Path, version: str, behaviour: str) -> None:
    """0.9-2.2 recover a segment whose indexes fail the sanity check; 2.3+ trust them (reference §1.3, §1.4)."""
    d = tmp_path / "lab"
    fleet_lab("up", "--dir", str(d), "--brokers", "1", "--kafka-version", version)
    try:
        state = fleet.LabState.load(d)
        b = state.broker(1)
        assert fleet.run_service(b, "stop").returncode == 0
        pdir = Path(b.log_dirs[0]) / "orders-0"
        idx = sorted(pdir.glob("*.index"))[0]
        good = idx.read_bytes()
        assert len(good) >= 16
        # the last entries zeroed, as an untrimmed index reads: last offset == base offset (fails the offset check
        # through 1.1) and last timestamp 0 < first timestamp (fails the time check through 2.2)
        damaged = good[:-8] + b"\0" * 8
        idx.write_bytes(damaged)
        tidx = idx.with_suffix(".timeindex")
        tgood = tidx.read_bytes()
        tidx.write_bytes(tgood[:-12] + b"\0" * 12)
        assert fleet.run_service(b, "start").returncode == 0
        log = (Path(b.run_dir) / "server.log").read_text()
        if behaviour == "rebuild":
            assert "Found a corrupted index file corresponding to log file" in log
            rebuilt = idx.read_bytes()  # recovery indexes each batch's last offset (the append path: the first)
            assert len(rebuilt) == len(good) and rebuilt != damaged
            rels = [int.from_bytes(rebuilt[i : i + 4], "big") for i in range(0, len(rebuilt), 8)]
            assert rels == sorted(rels) and rels[-1] > 0
            assert tidx.read_bytes() == tgood
        else:
            assert "Found a corrupted index file" not in log
            assert idx.read_bytes() == damaged and tidx.read_bytes()[-12:] == b"\0" * 12
    finally:
        fleet_lab("down", "--dir", str(d), check=False)


def test_seed_004_restarted_broker_leaves_isr_for_the_old_partitions(tmp_path: Path) -> None:
    d = tmp_path / "lab"
    fleet_lab("up", "--dir", str(d), "--brokers", "3", "--kafka-version", "2.8.2")
    try:
        r = fleet_lab("scenario", "seed-004", "--broker", "2", "--dir", str(d), "--json")
        assert all(json.loads(line)["ok"] for line in r.stdout.splitlines())
        state = fleet.LabState.load(d)
        zk = zk_client({"zookeeper": state.zookeeper})
        try:
            znode = json.loads(zk.get("/brokers/topics/seed-004")[0])
            zk_id = znode["topic_id"]
            out_of_isr, stale = set(), set()
            for p, replicas in znode["partitions"].items():
                if 2 not in replicas:
                    continue
                pm = next(
                    Path(x) / f"seed-004-{p}" / "partition.metadata"
                    for x in state.broker(2).log_dirs
                    if (Path(x) / f"seed-004-{p}").exists()
                )
                if parse_partition_metadata(pm.read_bytes(), str(pm))["topic_id"] != zk_id:
                    stale.add(int(p))
                if 2 not in state_of(zk, "seed-004", int(p))["isr"]:
                    out_of_isr.add(int(p))
            assert stale and out_of_isr == stale
            assert stale <= {0, 1, 2}  # the partitions that existed before the old client added 3-5
        finally:
            zk.stop()
        assert (
            "does not match the topic Id for partition seed-004-"
            in (Path(state.broker(2).run_dir) / "server.log").read_text()
        )
    finally:
        fleet_lab("down", "--dir", str(d), check=False)


def test_seed_000_broker_refuses_to_start_with_kafkas_message(tmp_path: Path) -> None:
    d = tmp_path / "lab"
    r = fleet_lab("scenario", "seed-000", "--dir", str(d), "--brokers", "2")
    try:
        assert "[ok] 3" in r.stdout
        st = json.loads(fleet_lab("status", "--dir", str(d), "--json").stdout)
        b1 = next(b for b in st["brokers"] if b["id"] == 1)
        assert not b1["running"] and st["kafka_version"].startswith("0.8")
        log = (d / "broker-1" / "server.log").read_text()
        fatal = [ln for ln in log.splitlines() if "FATAL" in ln and "Corrupt index found, index file (" in ln]
        assert fatal
        path = fatal[-1].split("index file (")[1].split(")")[0]
        assert Path(path).stat().st_size == DEFAULT_SEGMENT_INDEX_BYTES  # the untrimmed index it names
        assert Path(path).read_bytes()[-8:] == b"\0" * 8
        assert (Path(b1["log_dirs"][0]) / ".kafka_cleanshutdown").exists()
        # the seed's manual fix: delete the index the error names, start again (as often as it takes)
        state = fleet.LabState.load(d)
        for _ in range(10):
            Path(path).unlink()
            r = fleet.run_service(state.broker(1), "start")
            if r.returncode == 0:
                break
            path = r.stderr.rsplit("index file (", 1)[1].split(")")[0]
        assert r.returncode == 0, r.stderr
    finally:
        fleet_lab("down", "--dir", str(d), check=False)


def _wait_for(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_a_missing_leader_epoch_checkpoint_is_created_at_load_and_written_on_becoming_leader(tmp_path: Path) -> None:
    """Kafka's CheckpointFile creates a missing leader-epoch-checkpoint empty when the log loads (no entries are
    rebuilt from the log: the segments are not recovered after a clean stop); from 2.1 becoming leader with a new
    leader epoch assigns (epoch, log end offset) and flushes "0 / 1 / <epoch> <LEO>" (KAFKA-7415)."""
    from fleet_lab.kafka_files import log_end_offset

    d = tmp_path / "lab"
    fleet_lab("up", "--dir", str(d), "--brokers", "2", "--kafka-version", "2.8.2")
    try:
        state = fleet.LabState.load(d)
        b2 = state.broker(2)
        assert fleet.run_service(b2, "stop").returncode == 0
        pdirs = sorted(p for x in b2.log_dirs for p in Path(x).iterdir() if p.is_dir())
        assert len(pdirs) > 5 and all((p / "leader-epoch-checkpoint").exists() for p in pdirs)
        for p in pdirs:  # as the seed-004 repair leaves a drifted replica
            (p / "leader-epoch-checkpoint").unlink()
        assert fleet.run_service(b2, "start").returncode == 0
        fleet.wait_healthy(state, timeout=30)
        zk = zk_client({"zookeeper": state.zookeeper})
        try:

            def expected(p: Path) -> bytes:
                topic, _, part = p.name.rpartition("-")
                st = state_of(zk, topic, int(part))
                return f"0\n1\n{st['leader_epoch']} {log_end_offset(p)}\n".encode() if st["leader"] == 2 else b""

            def files_as_kafka_leaves_them() -> bool:
                return all((p / "leader-epoch-checkpoint").read_bytes() == expected(p) for p in pdirs)

            _wait_for(files_as_kafka_leaves_them, 10, "leader-epoch-checkpoint as Kafka leaves it")
            followed = [p for p in pdirs if expected(p) == b""]
            assert followed  # the stop moved leadership off broker 2: its replicas loaded as followers
            for q in followed:  # an empty file is a well-formed checkpoint with no entry
                assert parse_leader_epoch_checkpoint((q / "leader-epoch-checkpoint").read_bytes(), str(q)) == []
            # the controller makes broker 2 leader of one of them with a new leader epoch
            p = next(p for p in followed if log_end_offset(p) > 0)
            topic, _, part = p.name.rpartition("-")
            path = f"/brokers/topics/{topic}/partitions/{part}/state"
            raw, st = zk.get(path)
            old = json.loads(raw)
            new = dict(old, leader=2, leader_epoch=old["leader_epoch"] + 1)
            zk.set(path, json.dumps(new).encode(), version=st.version)
            want = f"0\n1\n{new['leader_epoch']} {log_end_offset(p)}\n".encode()
            _wait_for(lambda: (p / "leader-epoch-checkpoint").read_bytes() == want, 10, "the new leader's entry")
            assert all((q / "leader-epoch-checkpoint").read_bytes() == b"" for q in followed if q != p)
        finally:
            zk.stop()
    finally:
        fleet_lab("down", "--dir", str(d), check=False)


@pytest.mark.parametrize("version", ["2.8.2", "2.5.1"])
def test_leader_epoch_checkpoint_after_an_unclean_shutdown_comes_from_the_recovered_segments(
    tmp_path: Path, version: str
) -> None:
    """After a kill -9 Kafka recovers the segments from the recovery point on (here the active one) and assigns their
    batches' leader epochs to the cache: the only time a load puts entries from the log into the file. Epoch 0 is
    assigned from 2.7 (KAFKA-10432); 2.5 skips it, so only becoming leader (epoch 0 at the LEO) writes an entry."""
    from fleet_lab.kafka_files import log_end_offset, segment_bases

    d = tmp_path / "lab"
    fleet_lab("up", "--dir", str(d), "--brokers", "1", "--kafka-version", version)
    try:
        b = fleet.LabState.load(d).broker(1)
        pdirs = sorted(p for x in b.log_dirs for p in Path(x).iterdir() if p.is_dir())
        assert fleet.run_service(b, "kill").returncode == 0
        for p in pdirs:
            (p / "leader-epoch-checkpoint").unlink()
        assert fleet.run_service(b, "start").returncode == 0
        assert "Recovering unflushed segment" in (Path(b.run_dir) / "server.log").read_text()

        def entry(p: Path) -> int:  # the start offset of its one epoch-0 entry
            return segment_bases(p)[-1] if version == "2.8.2" else log_end_offset(p)

        def as_kafka_leaves_them() -> bool:
            return all((p / "leader-epoch-checkpoint").read_bytes() == f"0\n1\n0 {entry(p)}\n".encode() for p in pdirs)

        _wait_for(as_kafka_leaves_them, 10, "leader-epoch-checkpoint as Kafka leaves it")
        assert any(0 < segment_bases(p)[-1] < log_end_offset(p) for p in pdirs)  # the two versions differ there
    finally:
        fleet_lab("down", "--dir", str(d), check=False)


def test_kill9_untrimmed_index_leaves_a_crashed_brokers_files(lab3: dict[str, Any]) -> None:
    r = fleet_lab("inject", "kill9-untrimmed-index", "--broker", "3", "--dir", lab3["dir"], "--json")
    rec = json.loads(r.stdout)
    assert rec["rule"] == "index-untrimmed" and rec["broker_id"] == 3 and rec["paths"]
    st = json.loads(fleet_lab("status", "--dir", lab3["dir"], "--json").stdout)
    b3 = next(b for b in st["brokers"] if b["id"] == 3)
    assert not b3["running"] and processes_mentioning(str(Path(lab3["dir"]) / "broker-3" / "broker.json")) == []
    for d in map(Path, b3["log_dirs"]):
        assert not (d / ".kafka_cleanshutdown").exists()
    for path in rec["paths"]:
        data = Path(path).read_bytes()
        assert len(data) in (DEFAULT_SEGMENT_INDEX_BYTES, DEFAULT_SEGMENT_INDEX_BYTES - 4)
        assert data[-4096:] == b"\0" * 4096  # the preallocated zero tail
    zk = zk_client(lab3)
    try:
        deadline = time.monotonic() + 15
        while zk.exists("/brokers/ids/3") is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert zk.exists("/brokers/ids/3") is None  # the ephemeral znode went when the session expired
        fleet.wait_healthy(fleet.LabState.load(Path(lab3["dir"])), timeout=30, expect_down=frozenset({3}))
        assert all(3 not in state_of(zk, "orders", p)["isr"] for p in range(6))
    finally:
        zk.stop()
