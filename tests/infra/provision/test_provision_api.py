from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from carina.infra.provision.api import create_app
from carina.infra.provision.service import Provisioner

LAB = {"Authorization": "Bearer lab-token"}
OTHER = {"Authorization": "Bearer other-token"}


@pytest.fixture
def client(prov: Provisioner) -> Iterator[TestClient]:
    with TestClient(create_app(prov)) as c:
        yield c


def test_tokens(client: TestClient) -> None:
    assert client.get("/v1/images").status_code == 401
    assert client.get("/v1/images", headers={"Authorization": "Bearer nope"}).status_code == 401
    assert client.get("/v1/images", headers=LAB).json() == []


def test_openapi_is_published(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    assert doc["info"]["title"] == "carina provision"
    assert {"/v1/images", "/v1/nodes", "/v1/nodes/{name}/provision", "/boot/{mac}.ipxe"} <= set(doc["paths"])


def test_flow_and_errors(client: TestClient, prov: Provisioner, golden: Path) -> None:
    incoming = prov.config.path("incoming")
    incoming.mkdir()
    shutil.copyfile(golden, incoming / "golden.raw")
    r = client.post("/v1/images", json={"name": "gold", "path": str(golden)}, headers=LAB)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "path"  # outside incoming/
    r = client.post("/v1/images", json={"name": "gold", "path": "../../../etc/hostname"}, headers=LAB)
    assert r.status_code == 422
    r = client.post("/v1/images", json={"name": "gold", "path": "golden.raw"}, headers=LAB)
    assert r.status_code == 201, r.text
    r = client.post("/v1/nodes", json={"name": "n1", "mac": "52:54:00:aa:00:01"}, headers=LAB)
    assert r.status_code == 201, r.text
    # Invalid input: 422 naming the field.
    r = client.post("/v1/nodes", json={"name": "n2", "mac": "nope"}, headers=LAB)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "mac"
    r = client.put("/v1/nodes/n1/provision", json={"image": "gold", "export": "floppy"}, headers=LAB)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "export"
    r = client.post("/v1/nodes", json={"name": "n2", "mac": "52:54:00:aa:00:02", "params": {"x": 1}}, headers=LAB)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "power.x"
    # Another project's node and images are invisible: 404.
    assert client.put("/v1/nodes/n1/provision", json={"image": "gold"}, headers=OTHER).status_code == 404
    assert client.get("/v1/images", headers=OTHER).json() == []
    assert client.put("/v1/nodes/n1/provision", json={"image": "nope"}, headers=LAB).status_code == 404
    r = client.put("/v1/nodes/n1/provision", json={"image": "gold"}, headers=LAB)
    assert r.status_code == 200 and r.json()["uri"].endswith("/lab.n1")
    assert client.put("/v1/nodes/n1/provision", json={"image": "gold"}, headers=LAB).json() == r.json()
    assert client.delete("/v1/images/gold", headers=LAB).status_code == 409
    script = client.get("/boot/52-54-00-AA-00-01.ipxe")
    assert script.status_code == 200 and "root=nbd:127.0.0.1:" in script.text
    assert client.get("/boot/52:54:00:aa:00:99.ipxe").status_code == 404
    r = client.post("/v1/nodes/n1/snapshot", json={"image": "gold-2"}, headers=LAB)
    assert r.status_code == 201 and r.json()["source_node"] == "n1"
    assert client.post("/v1/nodes/n1/release", headers=LAB).json()["state"] == "free"
    assert client.delete("/v1/images/gold", headers=LAB).status_code == 204
    assert [i["name"] for i in client.get("/v1/images", headers=LAB).json()] == ["gold-2"]


def test_corrupt_image_is_a_clean_400(client: TestClient, prov: Provisioner) -> None:
    bad = prov.config.path("incoming", "bad.qcow2")
    bad.parent.mkdir()
    bad.write_bytes(b"QFI\xfb" + bytes(200))
    r = client.post("/v1/images", json={"name": "bad", "path": "bad.qcow2"}, headers=LAB)
    assert r.status_code == 400 and "qcow2" in r.json()["detail"]
    assert not prov.config.path("images", "lab").exists() or not any(prov.config.path("images", "lab").iterdir())
