"""A notifier as FLEET_DOCTOR_NOTIFIERS or an inventory's ``notifiers`` name one (``{"class": ..., "kwargs": ...}``,
Airflow's notifier interface: built with the kwargs, ``notify(context)``), writing what it was given to a file: the
on-call channel a test can read back."""

from __future__ import annotations

import json
from typing import Any

from airflow.sdk import BaseNotifier


class FileNotifier(BaseNotifier):
    def __init__(self, path: str, text: str) -> None:
        super().__init__()
        self.path, self.text = path, text

    def notify(self, context: Any) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"text": self.text}) + "\n")


class NotANotifier:
    """Any other class an inventory could name: building it is the harm (it writes ``path`` to say it was built)."""

    def __init__(self, path: str, text: str = "") -> None:
        with open(path, "w", encoding="utf-8") as f:
            f.write("built")

    def notify(self, context: Any) -> None:
        raise AssertionError("never called")
