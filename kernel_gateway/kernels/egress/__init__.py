"""Network by policy: the egress proxy (squid, in a container of its own), the relay that
joins a session's kernel to it with the session's own credentials, and the configuration
they share. See docs/network.md."""
