"""`fleet-doctor` command line (bin/fleet-doctor): ``main`` (the parser and the ``probe`` and ``zk-snapshot``
subcommands), ``scan`` (probe + detection on this machine), ``probe_table`` (the probe's ``--format table``)."""
