"""The REST API (FastAPI): per-project bearer tokens, an OpenAPI document, iPXE scripts.

Every ``/v1`` route needs ``Authorization: Bearer <project token>``; a wrong or missing
token gets 401, another project's node or image 404 (its existence is not revealed),
invalid input 422 naming the field, a state conflict 409. ``GET /boot/<mac>.ipxe`` is
open: firmware fetches it before any credentials exist, and it names only the node's
own target. Routes are plain ``def`` functions (run in FastAPI's thread pool) because
the provisioner blocks on subprocesses and QMP.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, Field, field_validator

from carina.core.errors import BackendUnavailable, ConfigError, ProvisioningError
from carina.infra.provision.boot import normalize_mac
from carina.infra.provision.config import ExportKind
from carina.infra.provision.errors import Conflict, NotFound
from carina.infra.provision.service import Provisioner

__all__ = ["create_app"]

_NAME = r"^[a-z0-9][a-z0-9.-]{0,47}$"


class ImageImport(BaseModel):
    """Import an image file from the service's ``<state>/incoming/`` folder (path relative to it)."""

    name: str = Field(pattern=_NAME)
    path: str = Field(min_length=1)
    format: str | None = Field(default=None, pattern=r"^(raw|qcow2)$")
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-fA-F]{64}$")


class NodeCreate(BaseModel):
    """Register a node."""

    name: str = Field(pattern=_NAME)
    mac: str
    power: str = Field(default="qemu", pattern=r"^(qemu|ipmi)$")
    params: dict[str, Any] = Field(default_factory=dict)

    @field_validator("mac")
    @classmethod
    def _mac(cls, value: str) -> str:
        return normalize_mac(value)


class ProvisionRequest(BaseModel):
    """Provision a node from an image."""

    image: str = Field(pattern=_NAME)
    export: ExportKind = ExportKind.NBD


class SnapshotRequest(BaseModel):
    """Save a node's disk as a new image."""

    image: str = Field(pattern=_NAME)


class ReleaseRequest(BaseModel):
    """Release a node's disk."""

    keep_disk: bool = False


_bearer = HTTPBearer(auto_error=False)


def _project(request: Request, cred: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> str:
    """The project the bearer token authenticates (401 otherwise)."""
    prov: Provisioner = request.app.state.provisioner
    name = prov.project_for_token(cred.credentials) if cred else None
    if name is None:
        raise HTTPException(401, "missing or invalid project token", headers={"WWW-Authenticate": "Bearer"})
    return name


Project = Annotated[str, Depends(_project)]


def create_app(prov: Provisioner, *, reconcile: bool = True) -> FastAPI:
    """The API over ``prov``; reconciles exports with the database first unless told not to."""
    if reconcile:
        prov.reconcile()
    app = FastAPI(
        title="carina provision",
        version="1",
        description="Bare-metal provisioning from network-mounted copy-on-write boot disks.",
    )
    app.state.provisioner = prov
    _install_errors(app)

    @app.get("/v1/images")
    def list_images(p: Project) -> list[dict[str, Any]]:
        return prov.list_images(p)

    @app.post("/v1/images", status_code=201)
    def import_image(p: Project, body: ImageImport) -> dict[str, Any]:
        # Only files dropped into <state>/incoming/ may be imported over the API: a path
        # anywhere else (a host disk, another tenant's files) is refused.
        incoming = prov.config.path("incoming")
        source = (incoming / body.path).resolve()
        if not source.is_relative_to(incoming):
            raise ConfigError("path must name a file inside the service's incoming/ folder", key="path")
        return prov.import_image(p, body.name, source, fmt=body.format, sha256=body.sha256)

    @app.delete("/v1/images/{name}", status_code=204)
    def delete_image(p: Project, name: str) -> None:
        prov.delete_image(p, name)

    @app.get("/v1/nodes")
    def list_nodes(p: Project) -> list[dict[str, Any]]:
        return prov.list_nodes(p)

    @app.post("/v1/nodes", status_code=201)
    def add_node(p: Project, body: NodeCreate) -> dict[str, Any]:
        return prov.add_node(p, body.name, body.mac, power=body.power, params=body.params)

    @app.put("/v1/nodes/{name}/provision")
    def provision(p: Project, name: str, body: ProvisionRequest) -> dict[str, Any]:
        placement = prov.provision(p, name, body.image, body.export)
        return {**placement.__dict__, "export": placement.export.value}

    @app.post("/v1/nodes/{name}/release")
    def release(p: Project, name: str, body: ReleaseRequest | None = None) -> dict[str, Any]:
        return prov.release(p, name, keep_disk=bool(body and body.keep_disk))

    @app.post("/v1/nodes/{name}/snapshot", status_code=201)
    def snapshot(p: Project, name: str, body: SnapshotRequest) -> dict[str, Any]:
        return prov.snapshot(p, name, body.image)

    @app.get("/boot/{mac}.ipxe", response_class=PlainTextResponse)
    def boot_script(mac: str) -> str:
        return prov.boot_script(mac)

    @app.get("/boot/files/{name}")
    def boot_file(name: str) -> FileResponse:
        if name not in ("vmlinuz", "initrd.gz"):
            raise HTTPException(404, "no such boot file")
        path = prov.config.path("boot-files", name)
        if not path.is_file():
            raise HTTPException(404, f"boot file {name} is not installed")
        return FileResponse(path)

    return app


def _install_errors(app: FastAPI) -> None:
    statuses: list[tuple[type[Exception], int]] = [
        (NotFound, 404),
        (Conflict, 409),
        (ConfigError, 422),
        (BackendUnavailable, 503),
        (ProvisioningError, 400),
    ]
    for cls, status in statuses:
        app.add_exception_handler(cls, _handler(status))


def _handler(status: int) -> Any:
    def handle(_request: Request, exc: Exception) -> JSONResponse:
        context = getattr(exc, "context", {})
        detail: Any = getattr(exc, "message", str(exc))
        if status == 422 and "key" in context:  # same shape as FastAPI's own validation errors
            detail = [{"loc": ["body", str(context["key"])], "msg": detail, "type": "value_error"}]
        return JSONResponse({"detail": detail, "context": {k: str(v) for k, v in context.items()}}, status)

    return handle
