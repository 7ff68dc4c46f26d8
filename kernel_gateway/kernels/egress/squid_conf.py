"""squid.conf for the egress proxy: pure text from a few paths and numbers.

What it enforces (each line below says which threat it answers):

- every request authenticates as a session (the gateway's relay adds the session's own
  credentials; the kernel never sees them), and its host must match that session's
  allowlist (squid's external ACL helper, `in_proxy/policy.py`, reads the policy file);
- ports 80 (plain HTTP) and 443 (CONNECT, for TLS) only;
- no IP literals: a name must be asked for, so the allowlist means something;
- no destination in loopback, private, link-local (169.254.169.254, the clouds' metadata
  service), carrier-grade NAT, multicast or reserved ranges, checked on the addresses the
  proxy itself resolved and then connects to (a name that resolves there is refused: DNS
  rebinding cannot reach the operator's network; `negative_dns_ttl` is also the floor of
  how long squid keeps a positive answer, so a name answered with TTL 0 keeps the checked
  addresses for the connection);
- nothing cached, no `Via` or `X-Forwarded-For`, one request per client connection (the
  relay reads each connection's first request head only).
"""

from __future__ import annotations

BLOCKED_DESTINATIONS = (
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "224.0.0.0/4",
    "240.0.0.0/4",
    "::/128",
    "::1",
    "64:ff9b::/96",
    "fc00::/7",
    "fe80::/10",
    "ff00::/8",
)
"""Where no allowlisted name may lead: the host, the operator's networks, link-local
(cloud metadata), CGNAT, benchmarking, multicast and reserved ranges, and their IPv6 twins
(NAT64 included). IPv4-mapped IPv6 addresses are IPv4 to squid: the IPv4 ranges cover them
(`::ffff:0:0/96` would be every IPv4 address to it)."""

POLICY_ERROR = "ERR_KG_POLICY"
PRIVATE_ERROR = "ERR_KG_PRIVATE"
LITERAL_ERROR = "ERR_KG_LITERAL"
PORT_ERROR = "ERR_KG_PORT"
ERROR_PAGES = {
    POLICY_ERROR: "%H is not in this session's network allowlist",
    PRIVATE_ERROR: "%H resolves to a private, loopback or link-local address",
    LITERAL_ERROR: "%H is an IP address: only allowlisted domain names can be reached",
    PORT_ERROR: "only ports 80 (http) and 443 (https) can be reached",
}
"""squid's error page for each refusal (%H: the host asked for). The gateway's relay also
puts the reason in the status line, where clients that show no body (CONNECT) show it."""


DECISION_SECONDS = 5
"""How long squid keeps an allowing decision of the policy helper."""


def render(*, port: int, policy: str, helper: str, errors: str, python: str) -> str:
    """squid.conf listening on 127.0.0.1:`port` (the proxy's own loopback), the policy file
    at `policy`, the helper script at `helper`, the error pages in `errors`."""
    blocked = " ".join(BLOCKED_DESTINATIONS)
    # An allow is remembered DECISION_SECONDS (a policy narrowed while a session runs holds
    # for its new connections within that); a refusal is never remembered.
    acl_options = f"ttl={DECISION_SECONDS} negative_ttl=0 children-max=2 children-startup=1"
    return f"""\
# Written by kernel-gateway (kernel_gateway/kernels/egress/squid_conf.py); do not edit.
http_port 127.0.0.1:{port}
pid_filename /tmp/squid.pid
coredump_dir /tmp
cache deny all
cache_mem 0 MB
access_log none
cache_log stdio:/dev/stderr
logfile_rotate 0
via off
forwarded_for delete
httpd_suppress_version_string on
client_persistent_connections off
shutdown_lifetime 1 seconds
pinger_enable off
connect_timeout 10 seconds
dns_timeout 5 seconds
negative_dns_ttl 30 seconds
error_directory {errors}

auth_param basic program {python} {helper} auth {policy}
auth_param basic children 2 startup=1 idle=1
auth_param basic realm kernel-gateway egress
auth_param basic credentialsttl 5 seconds
external_acl_type kg_allow {acl_options} %LOGIN %DST {python} {helper} allow {policy}

acl session proxy_auth REQUIRED
acl allowed external kg_allow
# Always true: ends a line whose other ACL needs a login, so a refusal is a 403 with its
# page, not a 407 asking for other credentials.
acl not_allowed src all
acl literal dstdom_regex ^[0-9.]+$ ^\\[ ^[0-9a-fA-F]*:[0-9a-fA-F:]*$
acl blocked dst {blocked}
acl web_ports port 80 443
acl tls_port port 443
acl CONNECT method CONNECT

http_access deny !web_ports
deny_info {PORT_ERROR} web_ports
http_access deny CONNECT !tls_port
deny_info {PORT_ERROR} tls_port
http_access deny literal
deny_info {LITERAL_ERROR} literal
http_access deny !session
http_access deny !allowed not_allowed
deny_info {POLICY_ERROR} not_allowed
http_access deny blocked
deny_info {PRIVATE_ERROR} blocked
http_access allow session
http_access deny all
"""


def error_page(text: str) -> str:
    """An error page template: plain text squid fills in (%H and the like)."""
    return f"kernel-gateway egress: refused: {text}\n"
