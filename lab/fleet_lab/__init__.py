"""The fleet lab: a small Kafka cluster on this machine for the demo and the tests (docs/lab.md).

A real ZooKeeper 3.8, a real ``sshd`` per broker, and lab brokers that stand in for the Kafka JVM wherever Fleet
Doctor touches it, writing byte-exact Kafka files. The lab uses the product (``fleet_doctor``: Kafka's formats from
the probe, the inventory); the product never imports the lab (tests/test_layout.py).
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def python_path() -> str:
    """PYTHONPATH for a lab process (a broker daemon started over SSH): the lab and the product library."""
    return os.pathsep.join((str(REPO / "lab"), str(REPO / "plugins")))
