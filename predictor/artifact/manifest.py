"""The artifact's manifest.json: its format, and path safety for every file it names."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from predictor.errors import StorageError, UnsafePath

MANIFEST = "manifest.json"


class ManifestFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str = Field(description="POSIX path relative to the artifact root.")
    size: int = Field(ge=0, description="Bytes.")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="Lower-case hex digest.")
    engines: list[str] | None = Field(
        default=None,
        description="Engines that read this file; None = all. A pod fetches only its engine's files.",
    )


class Manifest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    version: str
    engine: str = "piper-vits"  # model family; which engine reads which file is per file
    files: list[ManifestFile]

    def files_for(self, engine: str | None) -> list[ManifestFile]:
        """The files an engine needs (all of them when engine is None)."""
        return [f for f in self.files if engine is None or f.engines is None or engine in f.engines]

    @classmethod
    def loads(cls, data: str | bytes, *, source: str = MANIFEST) -> Manifest:
        """Parse a manifest; a malformed one is a StorageError naming where it came from."""
        try:
            return cls.model_validate_json(data)
        except ValidationError as exc:
            raise StorageError(f"{source} is not a valid manifest: {exc}") from None

    @classmethod
    def load(cls, path: Path) -> Manifest:
        return cls.loads(Path(path).read_bytes(), source=str(path))

    def dumps(self) -> str:
        return self.model_dump_json(indent=2) + "\n"

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def safe_join(root: Path, rel: str) -> Path:
    """``root / rel``, refusing any ``rel`` that could name something outside ``root``.

    Manifests come from a bucket we do not control, so an entry is treated like user input: only plain
    relative POSIX paths are accepted, and the result is also checked after resolving symlinks, because
    a link already inside ``root`` could otherwise point the write elsewhere.
    """
    if not rel or "\\" in rel or "\x00" in rel:
        raise UnsafePath(f"unsafe path in manifest: {rel!r}")
    pure = PurePosixPath(rel)
    if pure.is_absolute():
        raise UnsafePath(f"absolute path in manifest: {rel!r}")
    # split("/") rather than pure.parts: PurePosixPath silently drops "." and empty components.
    for part in rel.split("/"):
        if part in ("", ".", ".."):
            raise UnsafePath(f"unsafe path component {part!r} in manifest path {rel!r}")
    root_resolved = Path(root).resolve()
    target = root_resolved.joinpath(*pure.parts)
    if not target.resolve().is_relative_to(root_resolved):
        raise UnsafePath(f"manifest path {rel!r} resolves outside {root}")
    return target


def resolve_files(manifest: Manifest, root: Path) -> list[tuple[ManifestFile, Path]]:
    """Every manifest entry paired with its checked location under ``root``.

    On top of ``safe_join``: names starting with "." are reserved for the fetcher's own bookkeeping
    (``.verified/`` markers, ``.<name>.part-*`` temp files) so they can never collide with artifact
    files, the manifest's own name is reserved, and a path may appear only once.
    """
    seen: set[str] = set()
    out: list[tuple[ManifestFile, Path]] = []
    for f in manifest.files:
        target = safe_join(root, f.path)
        if any(part.startswith(".") for part in f.path.split("/")):
            raise UnsafePath(f"manifest path {f.path!r}: names starting with '.' are reserved")
        if f.path == MANIFEST:
            raise UnsafePath(f"manifest path {f.path!r} would overwrite the manifest")
        if f.path in seen:
            raise UnsafePath(f"manifest path {f.path!r} is listed twice")
        seen.add(f.path)
        out.append((f, target))
    return out
