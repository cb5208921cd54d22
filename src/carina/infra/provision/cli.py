"""``carina provision``: serve the API, manage images and nodes, provision and release.

The commands work directly on a state directory (the same one ``serve`` uses), so a
single machine needs no running server; the qemu-storage-daemon and tgtd they start
keep running between commands until ``carina provision down``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from carina.core.errors import CarinaError
from carina.core.progress import emit_json, print_table

if TYPE_CHECKING:
    from carina.infra.provision.config import ProvisionConfig
    from carina.infra.provision.service import Provisioner

app = typer.Typer(help="Bare-metal provisioning from network boot drives.", no_args_is_help=True)
image_app = typer.Typer(help="Golden images: import, list, snapshot, delete.", no_args_is_help=True)
node_app = typer.Typer(help="Nodes: add, list, provision, release, console.", no_args_is_help=True)
project_app = typer.Typer(help="Projects and their API tokens.", no_args_is_help=True)
app.add_typer(image_app, name="image")
app.add_typer(node_app, name="node")
app.add_typer(project_app, name="project")

State = Annotated[Path, typer.Option("--state", help="State directory (images, clones, database).")]
ConfigFile = Annotated[Path | None, typer.Option("--config", help="ProvisionConfig TOML/JSON (ports, backing).")]
ProjectOpt = Annotated[str, typer.Option("--project", "-p", help="Project that owns images and nodes.")]
Json = Annotated[bool, typer.Option("--json", help="Print JSON only.")]
_STATE = Path("carina-provision")


def _config(state: Path, config: Path | None) -> ProvisionConfig:
    from carina.infra.provision.config import ProvisionConfig

    cfg = ProvisionConfig.load(config) if config else ProvisionConfig()
    if state != _STATE or not config:
        cfg.state_dir = state
    return cfg


def _run(state: Path, config: Path | None, project: str | None, fn: Any, *, create: bool = False) -> Any:
    """Open the provisioner, make sure ``project`` exists, run ``fn(prov)``; errors exit 1.

    Only commands that add something (``create``) may start a new state directory: a
    mistyped ``--state`` must not read as an empty service.
    """
    from carina.core.errors import ProvisioningError
    from carina.infra.provision.service import Provisioner

    prov: Provisioner | None = None
    try:
        cfg = _config(state, config)
        if not create and not cfg.state_dir.is_dir():
            raise ProvisioningError(
                "no provisioning state here (add a project, image or node first)", path=str(cfg.state_dir)
            )
        prov = Provisioner(cfg)
        if project:
            prov.ensure_project(project)
        return fn(prov)
    except CarinaError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    finally:
        if prov is not None:
            prov.close()


def _out(obj: Any, as_json: bool, columns: list[str] | None = None, title: str | None = None) -> None:
    if as_json:
        emit_json(obj)
    elif columns is not None:
        print_table(obj, columns=columns, title=title)
    else:
        for key, value in obj.items():
            typer.echo(f"{key}: {value}")


@app.command()
def serve(
    state: State = _STATE,
    config: ConfigFile = None,
    host: Annotated[str | None, typer.Option(help="HTTP bind address (default: listen_host).")] = None,
    port: Annotated[int | None, typer.Option(help="HTTP port (default: http_port).")] = None,
) -> None:
    """Run the REST API (reconciles exports with the database first)."""
    import uvicorn

    from carina.infra.provision.api import create_app
    from carina.infra.provision.service import Provisioner

    cfg = _config(state, config)
    prov = Provisioner(cfg)
    try:
        uvicorn.run(create_app(prov), host=host or cfg.listen_host, port=port or cfg.http_port, log_level="info")
    finally:
        prov.close()


@app.command()
def reconcile(state: State = _STATE, config: ConfigFile = None, as_json: Json = False) -> None:
    """Re-create missing exports and remove unowned ones (after a crash)."""
    report = _run(state, config, None, lambda p: p.reconcile())
    _out({"restored": report.restored, "removed": report.removed}, as_json)


@app.command()
def down(state: State = _STATE, config: ConfigFile = None) -> None:
    """Stop the storage daemon and tgtd of this state directory (exports go away)."""
    _run(state, config, None, lambda p: p.exports.stop())


@project_app.command("add")
def project_add(name: str, state: State = _STATE, config: ConfigFile = None, as_json: Json = False) -> None:
    """Create a project and print its API token (shown once)."""
    token = _run(state, config, None, lambda p: p.create_project(name), create=True)
    _out({"project": name, "token": token}, as_json)


@project_app.command("token")
def project_token(name: str, state: State = _STATE, config: ConfigFile = None, as_json: Json = False) -> None:
    """Issue a new API token for a project (e.g. ``default``); the old one stops working."""
    token = _run(state, config, None, lambda p: p.rotate_token(name))
    _out({"project": name, "token": token}, as_json)


@image_app.command("import")
def image_import(
    name: str,
    path: Path,
    *,
    fmt: Annotated[str | None, typer.Option("--format", help="raw or qcow2 (default: detect).")] = None,
    sha256: Annotated[str | None, typer.Option(help="Expected SHA-256 of the file.")] = None,
    project: ProjectOpt = "default",
    state: State = _STATE,
    config: ConfigFile = None,
    as_json: Json = False,
) -> None:
    """Import a raw or qcow2 golden image (vetted, copied, checksummed)."""
    imported = _run(
        state, config, project, lambda p: p.import_image(project, name, path, fmt=fmt, sha256=sha256), create=True
    )
    _out(imported, as_json)


@image_app.command("ls")
def image_ls(
    project: ProjectOpt = "default", state: State = _STATE, config: ConfigFile = None, as_json: Json = False
) -> None:
    """List images."""
    rows = _run(state, config, project, lambda p: p.list_images(project))
    _out(rows, as_json, ["name", "format", "virtual_size", "size", "sha256", "source_node"], "images")


@image_app.command("rm")
def image_rm(name: str, project: ProjectOpt = "default", state: State = _STATE, config: ConfigFile = None) -> None:
    """Delete an image (refused while clones of it exist)."""
    _run(state, config, project, lambda p: p.delete_image(project, name))


@image_app.command("snapshot")
def image_snapshot(
    node: str,
    name: str,
    *,
    project: ProjectOpt = "default",
    state: State = _STATE,
    config: ConfigFile = None,
    as_json: Json = False,
) -> None:
    """Save NODE's disk as a new image NAME."""
    _out(_run(state, config, project, lambda p: p.snapshot(project, node, name)), as_json)


@node_app.command("add")
def node_add(
    name: str,
    mac: Annotated[str, typer.Option(help="The node's boot NIC MAC address.")],
    *,
    power: Annotated[str, typer.Option(help="Power driver: qemu or ipmi.")] = "qemu",
    param: Annotated[list[str] | None, typer.Option(help="Power parameter KEY=VALUE (repeat).")] = None,
    project: ProjectOpt = "default",
    state: State = _STATE,
    config: ConfigFile = None,
    as_json: Json = False,
) -> None:
    """Register a node by MAC."""
    params = dict(kv.split("=", 1) for kv in (param or []) if "=" in kv)
    added = _run(
        state, config, project, lambda p: p.add_node(project, name, mac, power=power, params=params), create=True
    )
    _out(added, as_json)


@node_app.command("ls")
def node_ls(
    project: ProjectOpt = "default", state: State = _STATE, config: ConfigFile = None, as_json: Json = False
) -> None:
    """List nodes."""
    rows = _run(state, config, project, lambda p: p.list_nodes(project))
    _out(rows, as_json, ["name", "mac", "power", "state", "image", "export"], "nodes")


@node_app.command("provision")
def node_provision(
    name: str,
    image: str,
    *,
    export: Annotated[str, typer.Option(help="nbd or iscsi.")] = "nbd",
    boot: Annotated[bool, typer.Option("--boot", help="Power the node on afterwards.")] = False,
    project: ProjectOpt = "default",
    state: State = _STATE,
    config: ConfigFile = None,
    as_json: Json = False,
) -> None:
    """Clone IMAGE for node NAME, export it, bind its iPXE script (and boot it)."""
    from carina.core.config import choice
    from carina.infra.provision.config import ExportKind

    try:
        kind = choice(ExportKind, export, key="export")
    except CarinaError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc

    def go(p: Provisioner) -> dict[str, Any]:
        placement = p.provision(project, name, image, kind)
        if boot:
            p.power_on(project, name)
        return {**placement.__dict__, "export": placement.export.value, "booted": boot}

    _out(_run(state, config, project, go), as_json)


@node_app.command("release")
def node_release(
    name: str,
    *,
    keep_disk: Annotated[bool, typer.Option("--keep-disk", help="Keep the clone (state retained).")] = False,
    project: ProjectOpt = "default",
    state: State = _STATE,
    config: ConfigFile = None,
    as_json: Json = False,
) -> None:
    """Power off, remove the export, delete the clone (unless --keep-disk)."""
    _out(_run(state, config, project, lambda p: p.release(project, name, keep_disk=keep_disk)), as_json)


@node_app.command("console")
def node_console(
    name: str,
    *,
    wait: Annotated[str | None, typer.Option(help="Wait until this text appears.")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait.")] = 120.0,
    project: ProjectOpt = "default",
    state: State = _STATE,
    config: ConfigFile = None,
    as_json: Json = False,
) -> None:
    """Print the node's serial console (QEMU nodes)."""

    def go(p: Provisioner) -> str:
        driver, handle = p.node_power(project, name)
        return driver.wait_console(handle, wait, timeout) if wait else driver.console(handle)

    text = _run(state, config, project, go)
    if as_json:
        emit_json({"node": name, "console": text})
    else:
        typer.echo(text, nl=False)
