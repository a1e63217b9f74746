"""Two hosts on one machine (network namespaces joined by a veth pair): hierarchical collectives
with the node level on each host's shared segment and the leader level across the veth link."""

from tests.multihost import run_hosts


def test_two_hosts_tcp():
    """3 ranks on host A, 2 on host B (uneven); between hosts the store-bootstrapped TCP transport."""
    run_hosts("tests/hosts/ranks.py", [3, 2], "tcp", timeout=150)
