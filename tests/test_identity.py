"""Is the SSH host broker N? (issue 15 item 15) On the fleet lab: a real sshd per broker with its own host key, and
log dirs whose meta.properties the lab brokers wrote at their first start, as Kafka does.

On real hosts every broker has the same ``log.dirs`` path (``/var/lib/kafka/data``), so an inventory entry pointing
at another host reads that host's meta.properties. The lab's brokers share one filesystem with a log dir path each,
so a swapped entry here carries the other broker's log dir paths: what ``/var/lib/kafka/data`` is on that host."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paramiko
import pytest

from fleet_doctor import inventory
from fleet_doctor.audit import steps
from fleet_doctor.identity import IdentityError, fingerprint, verify_broker
from fleet_doctor.layout import RunArea
from fleet_doctor.remote import Remote
from fleet_doctor.settings import Settings
from fleet_lab import fleet
from harness.ssh import ssh_client

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[inventory.Inventory]:
    lab_dir = tmp_path_factory.mktemp("identity") / "lab"
    fleet.up(lab_dir, brokers=2, kafka_version="2.8.2")
    try:
        yield inventory.load(lab_dir / "inventory.json")
    finally:
        fleet.down(lab_dir)


def _swapped(inv: inventory.Inventory) -> inventory.BrokerEntry:
    """Broker 1's entry with broker 2's host, port and host key (a copy-paste in the inventory)."""
    two = inv.broker(2)
    return dataclasses.replace(
        inv.broker(1), host=two.host, ssh_port=two.ssh_port, host_key=two.host_key, log_dirs=two.log_dirs
    )


def _unpinned_client(entry: inventory.BrokerEntry) -> paramiko.SSHClient:
    """A client that accepts any host key: the check that refuses a wrong one must be ``verify_broker``'s own."""
    return ssh_client(entry, trust_any_host_key=True)


def test_the_right_broker_passes(lab: inventory.Inventory) -> None:
    for entry in lab.brokers:
        client = ssh_client(entry)
        try:
            said = verify_broker(client, entry, require_meta=True)
            assert f"broker.id {entry.id} in {entry.log_dirs[0]}/meta.properties" in said
            assert fingerprint(entry.host_key) in said
            assert verify_broker(Remote(client, entry.id), entry) == said
        finally:
            client.close()


def test_an_entry_pointing_at_another_broker_is_refused_naming_both(lab: inventory.Inventory) -> None:
    entry = _swapped(lab)
    client = ssh_client(entry)  # the pinned key is the host's own: SSH alone cannot tell
    try:
        with pytest.raises(IdentityError) as e:
            verify_broker(client, entry)
    finally:
        client.close()
    msg = str(e.value)
    assert "inventory broker 1" in msg and "is broker 2, not broker 1" in msg
    assert f"{entry.log_dirs[0]}/meta.properties says broker.id 2" in msg


def test_a_host_key_other_than_the_pinned_one_is_refused(lab: inventory.Inventory) -> None:
    one, two = lab.broker(1), lab.broker(2)
    wrong = dataclasses.replace(one, host_key=two.host_key)  # right host, another pinned key
    client = _unpinned_client(one)
    try:
        with pytest.raises(IdentityError, match="presented host key") as e:
            verify_broker(client, wrong)
        assert fingerprint(one.host_key) in str(e.value) and fingerprint(two.host_key) in str(e.value)
        assert "inventory broker 1" in verify_broker(client, one)
    finally:
        client.close()
    client.close()
    with pytest.raises(IdentityError, match="not open"):
        verify_broker(client, one)


def test_log_dirs_without_meta_properties(lab: inventory.Inventory, tmp_path: Path) -> None:
    """A log dir Kafka has not used yet (no meta.properties) is accepted beside ones naming this broker; one naming
    another broker, an unreadable or invalid one is refused; with none at all only ``require_meta`` refuses."""
    one = lab.broker(1)
    new, other, bad, locked = (tmp_path / n for n in ("new-dir", "other", "bad", "locked"))
    for d in (new, other, bad, locked):
        d.mkdir()
    (other / "meta.properties").write_text("version=0\nbroker.id=7\n")
    (bad / "meta.properties").write_text("version=0\ncluster.id=x\n")
    (locked / "meta.properties").mkdir()  # unreadable as a file, whoever runs the tests (root reads a mode 0 one)
    client = ssh_client(one)
    try:
        said = verify_broker(client, dataclasses.replace(one, log_dirs=[*one.log_dirs, str(new)]))
        assert f"no meta.properties yet in {new}/meta.properties" in said
        assert "no meta.properties yet" in verify_broker(client, dataclasses.replace(one, log_dirs=[str(new)]))
        with pytest.raises(IdentityError, match="cannot be confirmed"):
            verify_broker(client, dataclasses.replace(one, log_dirs=[str(new)]), require_meta=True)
        with pytest.raises(IdentityError, match=re.escape(f"is broker 7, not broker 1: {other}/meta.properties says")):
            verify_broker(client, dataclasses.replace(one, log_dirs=[*one.log_dirs, str(new), str(other)]))
        with pytest.raises(IdentityError, match=r"names no broker\.id or node\.id"):
            verify_broker(client, dataclasses.replace(one, log_dirs=[str(bad)]))
        with pytest.raises(IdentityError, match=re.escape(f"cannot read {locked}/meta.properties")):
            verify_broker(client, dataclasses.replace(one, log_dirs=[str(locked)]))
    finally:
        client.close()


def test_staging_refuses_a_host_that_is_another_broker(lab: inventory.Inventory, tmp_path: Path) -> None:
    """The audit's stage step checks the identity before the probe runs: nothing is staged under broker 1's id."""
    swapped = dataclasses.replace(lab, brokers=[_swapped(lab), lab.broker(2)])
    store = Settings(inventory=tmp_path / "inv.json", data_root=tmp_path / "data").store
    broker = steps.discover(swapped, only=[1])["brokers"][0]
    client = ssh_client(swapped.broker(1))
    try:
        with pytest.raises(IdentityError, match="is broker 2, not broker 1"):
            steps.stage_broker(client, broker, store, RunArea("run"), deep=False, verify_crc=False)
    finally:
        client.close()
    assert store.files("run") == [] and store.files(RunArea("run").probe(1)) == []
    right = steps.discover(lab, only=[1])["brokers"][0]
    client = ssh_client(lab.broker(1))
    try:
        staged: dict[str, Any] = steps.stage_broker(client, right, store, RunArea("run"), deep=False, verify_crc=False)
    finally:
        client.close()
    assert staged["broker_id"] == 1 and "broker.id 1" in staged["identity"] and staged["partitions"]
