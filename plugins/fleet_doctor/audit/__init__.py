"""The nightly audit: ``steps`` (what the DAG's tasks call), ``staging`` (the staged form of the probe's output and
its commit protocol), ``history`` (publishing a run), ``report`` (findings for people), ``alerts``."""
