"""Sandbox networking: namespaces and veths, private bridges, DNS, egress rules in nftables."""
