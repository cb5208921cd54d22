"""``carina introspect``: scan disk images without booting, mounting or writing them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from carina.security.introspect.scan import ScanReport

app = typer.Typer(help="Agentless scanning of disk images.", no_args_is_help=True)
db_app = typer.Typer(help="Offline advisory database (OSV, Debian tracker).", no_args_is_help=True)
app.add_typer(db_app, name="db")

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]
DbOpt = Annotated[Path | None, typer.Option("--db", help="Advisory database (default: ~/.cache/carina).")]


@app.command()
def scan(
    images: Annotated[list[Path], typer.Argument(help="Disk images (raw, qcow2, vmdk, ...) or root dirs.")],
    db: DbOpt = None,
    rules: Annotated[str, typer.Option(help="YAML rule file; empty = starter set; 'none' = skip.")] = "",
    workers: Annotated[int, typer.Option(help="Images scanned in parallel.")] = 2,
    fail_on: Annotated[str, typer.Option(help="Exit 1 at findings of this severity or higher.")] = "high",
    sbom_dir: Annotated[Path | None, typer.Option("--sbom-dir", help="Write one CycloneDX SBOM per image.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Inventory, vulnerabilities and compliance of each image; exit code by severity."""
    from carina.core.progress import emit_json, progress
    from carina.security.introspect.scan import ScanConfig, default_db_path, exit_code, scan_many

    db_path = db if db is not None else default_db_path()
    cfg = ScanConfig(db=str(db_path) if db_path.is_file() else "", rules=rules, workers=workers, fail_on=fail_on)
    with progress() as bar:
        task = bar.add_task("scanning", total=len(images))
        reports = scan_many(images, cfg, on_done=lambda _: bar.advance(task))
    if sbom_dir is not None:
        from carina.security.introspect.sbom import to_cyclonedx

        sbom_dir.mkdir(parents=True, exist_ok=True)
        for r in reports:
            if r.inventory is not None:
                (sbom_dir / f"{Path(r.image).name}.cdx.json").write_text(to_cyclonedx(r.inventory, image_name=r.image))
    if json_out:
        emit_json({"db": cfg.db, "reports": [r.to_dict() for r in reports]})
    else:
        _tables(reports)
    raise typer.Exit(exit_code(reports, fail_on))


def _tables(reports: list[ScanReport]) -> None:
    from carina.core.progress import print_table

    rows = []
    for r in reports:
        inv = r.inventory
        rows.append(
            {
                "image": Path(r.image).name,
                "os": inv.os.get("PRETTY_NAME", "?") if inv else "-",
                "volumes": ",".join(r.volumes),
                "packages": len(inv.packages) if inv else 0,
                "vulns": len(r.findings),
                "failed rules": sum(c.status.value == "fail" for c in r.compliance),
                "status": "error" if r.error else ("partial" if r.partial else "ok"),
            }
        )
    print_table(rows, columns=list(rows[0]) if rows else ["image"], title="images")
    for r in reports:
        if r.error:
            typer.echo(f"error: {r.image}: {r.error}")
    for r in reports:
        if r.findings:
            print_table(
                [[f.id, f.package, f.installed, f.fixed or "-", f.severity] for f in r.findings],
                columns=["advisory", "package", "installed", "fixed", "severity"],
                title=f"vulnerabilities: {Path(r.image).name}",
            )
        failed = [c for c in r.compliance if c.status.value == "fail"]
        if failed:
            print_table(
                [[c.id, c.severity, c.evidence] for c in failed],
                columns=["rule", "severity", "evidence"],
                title=f"failed rules: {Path(r.image).name}",
            )


@app.command()
def inventory(
    image: Annotated[Path, typer.Argument(help="Disk image or root directory.")],
    json_out: JsonOpt = False,
) -> None:
    """Print what is installed and configured in one image."""
    from carina.core.progress import emit_json, print_table
    from carina.security.introspect.image import open_image
    from carina.security.introspect.inventory import collect_inventory

    view = open_image(image)
    inv = collect_inventory(view)
    if json_out:
        emit_json({"image": str(image), "inventory": inv.to_dict(), "warnings": view.warnings})
        return
    print_table(
        [[p.name, p.version, p.kind, p.arch] for p in inv.packages],
        columns=["package", "version", "kind", "arch"],
        title=f"{inv.os.get('PRETTY_NAME', '?')}: {len(inv.packages)} packages",
    )


@app.command()
def sbom(
    image: Annotated[Path, typer.Argument(help="Disk image or root directory.")],
    output: Annotated[Path | None, typer.Option("-o", "--output", help="File (default: stdout).")] = None,
) -> None:
    """Write a CycloneDX 1.6 JSON SBOM of one image."""
    from carina.security.introspect.image import open_image
    from carina.security.introspect.inventory import collect_inventory
    from carina.security.introspect.sbom import to_cyclonedx

    doc = to_cyclonedx(collect_inventory(open_image(image)), image_name=str(image))
    if output is None:
        typer.echo(doc)
    else:
        output.write_text(doc)


@app.command()
def oval(
    image: Annotated[Path, typer.Argument(help="Disk image or root directory.")],
    db: DbOpt = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="File (default: stdout).")] = None,
) -> None:
    """Write the image's Debian advisories as OVAL 5.11.2 definitions (for ``oscap oval eval``)."""
    from carina.security.introspect.advisories import load_db
    from carina.security.introspect.image import open_image
    from carina.security.introspect.inventory import collect_inventory
    from carina.security.introspect.oval import advisory_oval
    from carina.security.introspect.scan import default_db_path

    inv = collect_inventory(open_image(image))
    doc, _ = advisory_oval(
        load_db(db if db is not None else default_db_path()), inv.packages, os_version=inv.os.get("VERSION_ID", "")
    )
    if output is None:
        typer.echo(doc)
    else:
        output.write_text(doc)


@db_app.command("import")
def db_import(
    sources: Annotated[list[Path], typer.Argument(help="OSV JSON files/dirs/zips and Debian tracker JSON.")],
    db: DbOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Normalise advisory files into the offline database."""
    from carina.core.progress import emit_json
    from carina.security.introspect.advisories import import_db, load_db
    from carina.security.introspect.scan import default_db_path

    dest = import_db(sources, db if db is not None else default_db_path())
    count = len(load_db(dest))
    if json_out:
        emit_json({"db": str(dest), "advisories": count})
    else:
        typer.echo(f"imported {count} advisory entries into {dest}")
