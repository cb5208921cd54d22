"""Agentless introspection of disk images: open read-only, inventory, vulnerabilities, compliance, SBOM.

Image reading needs dissect.target (AGPL-3.0), part of the optional ``security`` extra;
it is imported only when an image is opened.
"""
