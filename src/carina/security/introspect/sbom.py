"""CycloneDX SBOM of an image's inventory (cyclonedx-python-lib, spec 1.6 JSON)."""

from __future__ import annotations

from carina.security.introspect.inventory import Inventory
from carina.security.introspect.packages import Package

__all__ = ["purl", "to_cyclonedx"]

_NAMESPACE = {"debian": "debian", "ubuntu": "ubuntu", "rhel": "redhat", "rocky": "rocky", "almalinux": "almalinux"}


def purl(pkg: Package, os_id: str, os_version: str) -> str:
    """The package URL of ``pkg`` (``pkg:deb/debian/openssh-server@1:9.2p1-2?arch=amd64&distro=debian-12``)."""
    from packageurl import PackageURL

    qualifiers: dict[str, str] = {}
    namespace = None
    if pkg.kind in ("deb", "rpm", "apk"):
        namespace = _NAMESPACE.get(os_id, os_id or None)
        if pkg.arch:
            qualifiers["arch"] = pkg.arch
        if os_id:
            qualifiers["distro"] = f"{os_id}-{os_version}" if os_version else os_id
        if pkg.source and pkg.source != pkg.name:
            qualifiers["upstream"] = pkg.source
    name = pkg.name
    if pkg.kind == "npm" and name.startswith("@") and "/" in name:
        namespace, name = name.split("/", 1)
    return str(PackageURL(type=pkg.kind, namespace=namespace, name=name, version=pkg.version, qualifiers=qualifiers))


def to_cyclonedx(inv: Inventory, *, image_name: str) -> str:
    """The inventory as a CycloneDX 1.6 JSON document (the OS is the BOM's subject)."""
    from cyclonedx.model.bom import Bom
    from cyclonedx.model.component import Component, ComponentType
    from cyclonedx.output.json import JsonV1Dot6
    from packageurl import PackageURL

    os_id, os_version = inv.os.get("ID", "unknown"), inv.os.get("VERSION_ID", "")
    bom = Bom()
    subject = Component(
        name=os_id, version=os_version or None, type=ComponentType.OPERATING_SYSTEM, description=image_name
    )
    bom.metadata.component = subject
    comps = []
    seen: set[str] = set()
    for pkg in inv.packages:
        ref = purl(pkg, os_id, os_version)
        if ref in seen or pkg.state not in ("installed", "unknown"):
            continue
        seen.add(ref)
        comp = Component(
            name=pkg.name,
            version=pkg.version,
            type=ComponentType.LIBRARY if pkg.kind in ("pypi", "npm") else ComponentType.APPLICATION,
            purl=PackageURL.from_string(ref),
            bom_ref=ref,
        )
        comps.append(comp)
        bom.components.add(comp)
    bom.register_dependency(subject, comps)
    return str(JsonV1Dot6(bom).output_as_string(indent=2))
