"""From a deploy request's bytes to validated input: the parsed body, the files, the merged settings.

Zip archives are unpacked in memory with the same path rules as the ``files`` variant: entries with
absolute paths, ``..`` segments, backslashes or symlinks are rejected, and so are archives that would
unpack to more than ``MAX_UNPACKED_BYTES`` or ``MAX_FILES`` entries, or whose entries claim a
compression ratio typical of zip bombs. Sizes are counted while reading, never trusted from headers.
"""

from __future__ import annotations

import io
import stat
import zipfile
from dataclasses import dataclass
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from paddock_core import jsonbody
from paddock_gateway.adapters.hosting import DeployOptions, UploadedFile
from paddock_gateway.errors import InvalidBody, InvalidJson
from paddock_gateway.schemas import MAX_FILES, DeployRequest, FilesUpload, check_relative_path, error_field

M = TypeVar("M", bound=BaseModel)

MAX_UNPACKED_BYTES = 256 * 1024 * 1024
MAX_RATIO = 200
CHUNK = 1 << 16


@dataclass(frozen=True)
class DeployInput:
    request: DeployRequest
    files: list[UploadedFile]
    options: DeployOptions


def is_json_content_type(value: str | None) -> bool:
    return (value or "").split(";", 1)[0].strip().lower() == "application/json"


def parse_body(raw: bytes, content_type: str | None) -> DeployRequest:
    return parse_model(raw, content_type, DeployRequest)


def parse_model(raw: bytes, content_type: str | None, model: type[M]) -> M:
    """A JSON body as ``model``: 400 ``invalid_json`` or ``invalid_body`` naming the field."""
    if not is_json_content_type(content_type):
        raise InvalidJson("Content-Type must be application/json")
    # One parse, with the boundary rule shared with the control plane: NUL in a string, NaN/Infinity
    # and nesting deeper than 32 levels are a 400 naming the field.
    try:
        data = jsonbody.parse(raw)
    except jsonbody.JsonSyntaxError:
        raise InvalidJson() from None
    except jsonbody.JsonBodyError as exc:
        raise InvalidBody([{"field": exc.field, "message": exc.reason}]) from None
    if not isinstance(data, dict):
        raise InvalidBody([{"field": "body", "message": "must be a JSON object"}])
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        details: list[dict[str, str]] = []
        for err in exc.errors(include_url=False, include_input=False):
            message = str(err.get("msg", "invalid")).removeprefix("Value error, ")
            details.append({"field": error_field(tuple(err.get("loc", ()))), "message": message})
        raise InvalidBody(details) from exc


def unpack_zip(data: bytes) -> list[UploadedFile]:
    def fail(message: str) -> InvalidBody:
        return InvalidBody([{"field": "upload.data", "message": message}])

    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        entries = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise fail("is not a readable ZIP archive") from exc
    if len(entries) > MAX_FILES:
        raise fail(f"has more than {MAX_FILES} entries")
    files: list[UploadedFile] = []
    seen: set[str] = set()
    total = 0
    with archive:
        for entry in entries:
            if entry.is_dir():
                continue
            if stat.S_ISLNK(entry.external_attr >> 16):
                raise fail(f"entry {entry.filename!r} is a symbolic link")
            try:
                path = check_relative_path(entry.filename)
            except ValueError as exc:
                raise fail(f"entry {entry.filename!r}: {exc}") from exc
            if path in seen:
                raise fail(f"duplicate entry {path!r}")
            seen.add(path)
            if entry.compress_size and entry.file_size / entry.compress_size > MAX_RATIO:
                raise fail(f"entry {path!r} has a compression ratio typical of a zip bomb")
            buffer = bytearray()
            try:
                with archive.open(entry) as stream:
                    while chunk := stream.read(CHUNK):
                        buffer += chunk
                        total += len(chunk)
                        if total > MAX_UNPACKED_BYTES:
                            raise fail(f"unpacks to more than {MAX_UNPACKED_BYTES >> 20} MiB")
                        if entry.compress_size and len(buffer) / entry.compress_size > MAX_RATIO:
                            raise fail(f"entry {path!r} has a compression ratio typical of a zip bomb")
            except (zipfile.BadZipFile, OSError, NotImplementedError, RuntimeError, EOFError) as exc:
                raise fail(f"entry {path!r} cannot be read") from exc
            files.append(UploadedFile(path=path, data=bytes(buffer)))
    if not files:
        raise fail("contains no files")
    return files


def options_from(request: DeployRequest) -> DeployOptions:
    s = request.settings
    if s is None:
        return DeployOptions()
    return DeployOptions(
        port=s.port,
        runtime=s.runtime,
        use_build_ai=s.useBuildAI,
        has_dockerfile=s.hasDockerfile,
        framework=s.framework,
        install_command=s.installCommand,
        build_command=s.buildCommand,
        run_command=s.runCommand,
        build_dir=s.buildDir,
        build_flag=s.buildFlag,
        run_flag=s.runFlag,
        directory_path=s.directoryPath,
        run_envs=dict(s.runEnvs or {}),
        build_vars=dict(s.buildVars or {}),
    )


def deploy_input(raw: bytes, content_type: str | None) -> DeployInput:
    """Parse and validate a deploy body (§5.3.3 step 4); raises ``InvalidJson`` / ``InvalidBody``."""
    request = parse_body(raw, content_type)
    if isinstance(request.upload, FilesUpload):
        files = [UploadedFile(path=item.path, data=item.content) for item in request.upload.files]
    else:
        files = unpack_zip(request.upload.data)
    options = options_from(request)
    if options.directory_path:
        prefix = options.directory_path.rstrip("/") + "/"
        if not any(f.path.startswith(prefix) for f in files):
            raise InvalidBody(
                [{"field": "settings.directoryPath", "message": "no uploaded file is under it"}]
            )
    return DeployInput(request=request, files=files, options=options)
