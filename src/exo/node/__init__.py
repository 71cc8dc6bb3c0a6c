"""The node's own parts beside ``exo.main.Node``: what the node reports about itself
(``info``), where answers go, and which requests wait on what."""
