"""Human-approved repairs: ``plan`` (what a repair will do, content-addressed), ``executor`` (the per-broker state
machine), ``topic_ids`` (the preventive ZooKeeper write), ``restore`` (putting backups back), ``tasks`` (what the
DAGs call)."""
