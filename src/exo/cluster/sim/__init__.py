"""A deterministic simulator of a cluster: N nodes' real cluster code (``ClusterLink``:
election, replicated log, catch-up and snapshots, membership, command delivery) in one
process, over a simulated network (``net``) on a virtual clock (``loop``), with seeded
faults, and invariants checked as it runs (``run``)."""
