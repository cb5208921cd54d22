"""The image catalogue: import, list, snapshot and delete golden images.

Imported files are vetted (:func:`~carina.infra.provision.imagefile.inspect_image`)
before a byte is copied, copied atomically with a SHA-256, and only then recorded.
An image that any node's disk still uses cannot be deleted.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from carina.core.errors import ProvisioningError
from carina.infra.provision.config import NodeState, ProvisionConfig, check_name
from carina.infra.provision.errors import Conflict, NotFound
from carina.infra.provision.imagefile import copy_checksummed, inspect_image, sha256_file
from carina.infra.provision.state import ImageRow, NodeRow, ProjectRow

__all__ = ["ImageCatalog"]


class ImageCatalog:
    """Images of every project, stored under ``<state_dir>/images/<project>/``."""

    def __init__(self, config: ProvisionConfig) -> None:
        self.config = config

    def image_path(self, project: str, name: str, fmt: str) -> Path:
        """Where image ``name`` of ``project`` lives."""
        return self.config.path("images", project, f"{name}.{fmt}")

    def get(self, session: Session, project: ProjectRow, name: str) -> ImageRow:
        """The image row, or NotFound."""
        row = session.scalar(select(ImageRow).where(ImageRow.project_id == project.id, ImageRow.name == name))
        if row is None:
            raise NotFound(f"no image {name!r} in project {project.name!r}", image=name)
        return row

    def list(self, session: Session, project: ProjectRow) -> list[ImageRow]:
        """All images of ``project``, by name."""
        rows = session.scalars(select(ImageRow).where(ImageRow.project_id == project.id).order_by(ImageRow.name))
        return list(rows)

    def add(
        self,
        session: Session,
        project: ProjectRow,
        name: str,
        source: Path,
        *,
        fmt: str | None = None,
        sha256: str | None = None,
    ) -> ImageRow:
        """Import ``source`` (raw or qcow2) as image ``name``.

        Raises:
            ConfigError: Bad name.
            Conflict: The name is taken.
            ProvisioningError: Unreadable, unsupported or corrupt image; checksum mismatch.
        """
        check_name(name, key="name")
        self._free_name(session, project, name)
        facts = inspect_image(Path(source), fmt)
        dest = self.image_path(project.name, name, facts.format)
        digest = copy_checksummed(Path(source), dest, expect_sha256=sha256)
        row = ImageRow(
            project_id=project.id,
            name=name,
            format=facts.format,
            path=str(dest),
            size=dest.stat().st_size,
            virtual_size=facts.virtual_size,
            sha256=digest,
        )
        return self._record(session, row, dest)

    def add_flattened(
        self, session: Session, project: ProjectRow, name: str, node: NodeRow, flatten: Callable[[Path], object]
    ) -> ImageRow:
        """Record a snapshot of ``node``'s disk written by ``flatten(dest)`` as image ``name``."""
        check_name(name, key="name")
        self._free_name(session, project, name)
        dest = self.image_path(project.name, name, "qcow2")
        tmp = dest.with_name(f".{dest.name}.{secrets.token_hex(4)}.tmp")
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            flatten(tmp)
            facts = inspect_image(tmp, "qcow2")
            tmp.rename(dest)
        finally:
            tmp.unlink(missing_ok=True)
        row = ImageRow(
            project_id=project.id,
            name=name,
            format="qcow2",
            path=str(dest),
            size=dest.stat().st_size,
            virtual_size=facts.virtual_size,
            sha256=sha256_file(dest),
            parent_id=node.image_id,
            source_node=node.name,
        )
        return self._record(session, row, dest)

    def remove(self, session: Session, project: ProjectRow, name: str) -> None:
        """Delete an image no node disk depends on.

        Raises:
            NotFound: No such image.
            Conflict: Clones of it still exist (names the nodes).
        """
        row = self.get(session, project, name)
        users = session.scalars(
            select(NodeRow.name).where(NodeRow.image_id == row.id, NodeRow.state != NodeState.FREE.value)
        ).all()
        if users:
            raise Conflict(f"image {name!r} still has clones on nodes {', '.join(sorted(users))}", image=name)
        for child in session.scalars(select(ImageRow).where(ImageRow.parent_id == row.id)):
            child.parent_id = None  # snapshots are flattened: lineage only, no data dependency
        session.delete(row)
        session.commit()
        Path(row.path).unlink(missing_ok=True)

    def _free_name(self, session: Session, project: ProjectRow, name: str) -> None:
        taken = session.scalar(select(ImageRow.id).where(ImageRow.project_id == project.id, ImageRow.name == name))
        if taken is not None:
            raise Conflict(f"image {name!r} already exists in project {project.name!r}", image=name)

    def _record(self, session: Session, row: ImageRow, dest: Path) -> ImageRow:
        session.add(row)
        try:
            session.commit()
        except Exception as exc:
            session.rollback()
            dest.unlink(missing_ok=True)
            raise ProvisioningError(f"could not record image: {exc}", image=row.name) from exc
        return row
