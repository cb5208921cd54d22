"""The service's database: projects, images and nodes (SQLAlchemy; SQLite by default)."""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets
from typing import Any

from sqlalchemy import JSON, DateTime, ForeignKey, Integer, String, UniqueConstraint, create_engine, event
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

__all__ = ["Base", "ImageRow", "NodeRow", "ProjectRow", "hash_token", "new_token", "open_database"]


class Base(DeclarativeBase):
    """Declarative base of the provisioning schema."""


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class ProjectRow(Base):
    """A tenant: owns images and nodes; authenticates with a token (only its hash is kept)."""

    __tablename__ = "projects"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(48), unique=True)
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)


class ImageRow(Base):
    """A golden image or a snapshot (``parent_id`` and ``source_node`` record lineage)."""

    __tablename__ = "images"
    __table_args__ = (UniqueConstraint("project_id", "name"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id"))
    name: Mapped[str] = mapped_column(String(48))
    format: Mapped[str] = mapped_column(String(8))
    path: Mapped[str] = mapped_column(String(1024))
    size: Mapped[int] = mapped_column(Integer)
    virtual_size: Mapped[int] = mapped_column(Integer)
    sha256: Mapped[str] = mapped_column(String(64))
    parent_id: Mapped[int | None] = mapped_column(ForeignKey("images.id"), nullable=True)
    source_node: Mapped[str | None] = mapped_column(String(48), nullable=True)
    created: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=_now)

    def to_dict(self) -> dict[str, Any]:
        """Public view of the row."""
        return {
            "name": self.name,
            "format": self.format,
            "size": self.size,
            "virtual_size": self.virtual_size,
            "sha256": self.sha256,
            "source_node": self.source_node,
            "created": self.created.isoformat(timespec="seconds") if self.created else None,
        }


class NodeRow(Base):
    """A machine: its MAC, power driver and (when provisioned) its clone and export."""

    __tablename__ = "nodes"
    __table_args__ = (UniqueConstraint("project_id", "name"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id"))
    name: Mapped[str] = mapped_column(String(48))
    mac: Mapped[str] = mapped_column(String(17), unique=True)
    power_driver: Mapped[str] = mapped_column(String(16))
    power_params: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    state: Mapped[str] = mapped_column(String(16), default="free")
    image_id: Mapped[int | None] = mapped_column(ForeignKey("images.id"), nullable=True)
    export_kind: Mapped[str | None] = mapped_column(String(8), nullable=True)
    disk_path: Mapped[str | None] = mapped_column(String(1024), nullable=True)


def hash_token(token: str) -> str:
    """SHA-256 of a project token (tokens themselves are never stored)."""
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    """A fresh random project token."""
    return secrets.token_urlsafe(24)


def open_database(url: str) -> sessionmaker[Session]:
    """Create the schema if needed and return a session factory."""
    engine = create_engine(url, connect_args={"timeout": 30} if url.startswith("sqlite") else {})
    if url.startswith("sqlite"):
        event.listen(engine, "connect", _sqlite_pragmas)
    Base.metadata.create_all(engine)
    return sessionmaker(engine, expire_on_commit=False)


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA journal_mode=WAL")
    cur.close()
