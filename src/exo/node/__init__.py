"""The node's own parts beside ``exo.main.Node``: where answers go, and which requests wait
on what."""
