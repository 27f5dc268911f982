"""A notifier as FLEET_DOCTOR_NOTIFIERS or an inventory's ``notifiers`` name one (``{"class": ..., "kwargs": ...}``,
Airflow's notifier interface: built with the kwargs, ``notify(context)``), writing what it was given to a file: the
on-call channel a test can read back."""

from __future__ import annotations

import json
from typing import Any


class FileNotifier:
    def __init__(self, path: str, text: str) -> None:
        self.path, self.text = path, text

    def notify(self, context: dict[str, Any]) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"text": self.text}) + "\n")
