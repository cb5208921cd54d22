"""Compliance rules: the starter set on clean and misconfigured images, and rule-file errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from carina.core.errors import ModelFormatError
from carina.security.introspect.compliance import Status, evaluate, load_rules, starter_rules
from carina.security.introspect.image import open_image
from carina.security.introspect.inventory import collect_inventory
from carina.testing.introspect import BASE_PACKAGES, DebPkg, FakeDebian, build_image, write_tree


def _results(image: Path) -> dict[str, Status]:
    view = open_image(image)
    return {r.id: r.status for r in evaluate(starter_rules(), collect_inventory(view), view)}


def test_clean_image_passes(debian_images: dict[str, Path]) -> None:
    got = _results(debian_images["xfs"])
    assert got.pop("telnet-server-absent-rhel") is Status.NOT_APPLICABLE
    assert set(got.values()) == {Status.PASS}, got


def test_misconfigured_image_fails_the_right_rules(tmp_path: Path) -> None:
    spec = FakeDebian(
        packages=[*BASE_PACKAGES, DebPkg(name="telnetd", version="0.17+2.4-2")],
        permit_root_login="yes",
        password_authentication="yes",
        empty_password_user=True,
        world_writable=("etc/app.conf",),
        shadow_mode=0o644,
    )
    image = build_image(write_tree(tmp_path / "r", spec), tmp_path / "bad.img", "gpt", size_mb=32)
    failed = {k for k, v in _results(image).items() if v is Status.FAIL}
    assert failed == {
        "sshd-permit-root-login",
        "sshd-password-authentication",
        "no-empty-passwords",
        "shadow-permissions",
        "no-world-writable-files",
        "telnet-server-absent",
    }


def test_custom_rules_and_errors() -> None:
    rules = load_rules(
        "rules:\n  - id: ssh-on\n    title: t\n    severity: low\n    service: {name: ssh.service, state: enabled}\n"
    )
    assert rules[0].check == "service"
    with pytest.raises(ModelFormatError) as exc:
        load_rules(
            "rules:\n  - id: a\n    title: t\n    severity: low\n  - {id: b, title: t, severity: x, package: {}}\n"
        )
    assert exc.value.context["line"] == 2  # the first rule has no check
    with pytest.raises(ModelFormatError, match="needs 'name'"):
        load_rules("rules:\n  - {id: b, title: t, severity: x, package: {}}\n")
    with pytest.raises(ModelFormatError, match="bad pattern"):
        load_rules("rules:\n  - {id: b, title: t, severity: x, file_content: {path: /a, pattern: '('}}\n")
    with pytest.raises(ModelFormatError, match="not YAML"):
        load_rules("rules: [\n")
