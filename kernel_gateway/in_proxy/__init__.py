"""Code that runs inside the egress proxy's container (squid's helpers), apart from the
gateway: it imports nothing of ours, and the gateway imports its pure functions."""
