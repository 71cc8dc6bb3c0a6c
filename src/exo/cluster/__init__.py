"""The cluster part of a node: election (pure), lineage and membership (pure), and the
cluster link that keeps this node's replica of the master's log over the router."""
