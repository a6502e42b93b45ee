"""What the control plane's OpenAPI document says beyond FastAPI's view of the routes (spec §4, §5, §11).

``paddock_core.openapi`` applies it: JSend envelopes, the ``X-Api-Key`` scheme, the hand-parsed bodies
and query parameters (with the models that validate them), and each operation's error statuses.
"""

from __future__ import annotations

from pydantic import BaseModel

from paddock_controlplane.records.queries import MAX_WAIT_MS, STATUSES
from paddock_controlplane.records.schemas.access_tokens import AccessTokenRequest
from paddock_controlplane.records.schemas.commands import ExecRequest, FileUrlRequest
from paddock_controlplane.records.schemas.computer import (
    ClipboardRequest,
    KeysRequest,
    LaunchRequest,
    MouseButtonRequest,
    MouseClickRequest,
    MouseDragRequest,
    MouseMoveRequest,
    MouseScrollRequest,
    OpenRequest,
    ScreenSizeRequest,
    TypeRequest,
    WindowMoveRequest,
    WindowSizeRequest,
)
from paddock_controlplane.records.schemas.disks import DiskAttachment, DiskCreateRequest, DiskPatchRequest
from paddock_controlplane.records.schemas.networks import NetworkAttachRequest, NetworkCreateRequest
from paddock_controlplane.records.schemas.processes import (
    ProcessInputRequest,
    ProcessResizeRequest,
    ProcessSignalRequest,
    ProcessStartRequest,
)
from paddock_controlplane.records.schemas.sandboxes import (
    EgressRequest,
    ForkSandboxRequest,
    PatchSandboxRequest,
    RechargeRequest,
    SshKeysRequest,
)
from paddock_controlplane.records.schemas.snapshots import SnapshotCreateRequest
from paddock_controlplane.records.schemas.templates import TemplateCreateRequest
from paddock_controlplane.records.schemas.volumes import (
    VolumeAttachment,
    VolumeCreateRequest,
    VolumeResizeRequest,
)
from paddock_controlplane.sandboxes import sandbox_fs
from paddock_core.openapi import JSEND_ERROR, JSEND_FAIL, JSEND_SUCCESS, Contract, JsonSchema, Operation

SANDBOX = "/v1/sandboxes/{sandbox_id}"
#: Work on a sandbox can meet its state (409) and its host (503, no side effects, retried by clients).
ON_A_SANDBOX = (409, 503)
#: Operations that start compute can meet the plan (403) and the credit balance (402).
STARTS_COMPUTE = (402, 403, 409, 503)


def query(name: str, schema: JsonSchema, description: str) -> JsonSchema:
    return {"name": name, "in": "query", "required": False, "schema": schema, "description": description}


def guest_path(name: str, description: str) -> JsonSchema:
    """A required absolute path inside the sandbox (``validation.guest_path``: 400 naming ``name``)."""
    schema = {"type": "string", "minLength": 1, "pattern": "^/"}
    return {"name": name, "in": "query", "required": True, "schema": schema, "description": description}


GUEST_PATH = guest_path("path", "absolute path inside the sandbox")
DEPTH = query(
    "depth",
    {"type": "integer", "minimum": 1, "maximum": sandbox_fs.MAX_DEPTH},
    "levels below path to list (default 1)",
)
SIGNED_LINK = (
    query("expires", {"type": "string", "pattern": "^[0-9]{1,12}$"}, "a signed link's expiry (Unix seconds)"),
    query("signature", {"type": "string"}, "a signed link's signature (POST …/files/url makes both)"),
)
RECURSIVE = query(
    "recursive", {"type": "string", "enum": ["true", "false"]}, "watch the whole tree below path"
)
WAIT = (
    query(
        "wait_for",
        {"type": "string", "enum": sorted(STATUSES)},
        "answer once the sandbox is in this status, or in one it will not leave on its own (extension)",
    ),
    query(
        "wait_ms",
        {"type": "integer", "minimum": 0, "maximum": MAX_WAIT_MS},
        "longest wait in ms (default 10000); only with wait_for",
    ),
)
STATUS_FILTER = query("status", {"type": "string", "enum": sorted(STATUSES)}, "only sandboxes in this status")
STREAM = query("stream", {"type": "string", "enum": ["true", "false"]}, "answer with NDJSON frames")

AUDIT_QUERY = (
    query(
        "kind",
        {
            "type": "string",
            "pattern": "^(api|command|file|process|egress|dropped)(,(api|command|file|process|egress|dropped))*$",
        },
        "only events of these kinds, comma-separated",
    ),
    query("since", {"type": "string", "format": "date-time"}, "only events at or after this time (RFC 3339)"),
    query("until", {"type": "string", "format": "date-time"}, "only events before this time (RFC 3339)"),
    query("limit", {"type": "integer", "minimum": 1}, "page size (default 100; above 1000 is clamped)"),
    query("cursor", {"type": "string"}, "the next_cursor of the page before"),
    query(
        "order",
        {"type": "string", "enum": ["oldest", "newest"]},
        "oldest first (default) or newest first; the JSON lines export is oldest first only",
    ),
    query(
        "format", {"type": "string", "enum": ["json", "jsonl"]}, "jsonl: every matching event as JSON lines"
    ),
)

#: §12.3 routes besides the screenshot: (method, suffix, body model, whether a body must be sent).
COMPUTER_OPERATIONS: tuple[tuple[str, str, type[BaseModel] | None, bool], ...] = (
    ("GET", "/screen", None, False),
    ("GET", "/cursor", None, False),
    ("GET", "/clipboard", None, False),
    ("PUT", "/clipboard", ClipboardRequest, True),
    ("POST", "/open", OpenRequest, True),
    ("POST", "/launch", LaunchRequest, True),
    ("POST", "/mouse/move", MouseMoveRequest, True),
    ("POST", "/mouse/click", MouseClickRequest, False),
    ("POST", "/mouse/scroll", MouseScrollRequest, False),
    ("POST", "/mouse/drag", MouseDragRequest, True),
    ("POST", "/mouse/down", MouseButtonRequest, False),
    ("POST", "/mouse/up", MouseButtonRequest, False),
    ("POST", "/keyboard/type", TypeRequest, True),
    ("POST", "/keyboard/press", KeysRequest, True),
    ("POST", "/keyboard/down", KeysRequest, True),
    ("POST", "/keyboard/up", KeysRequest, True),
    ("GET", "/windows", None, False),
    ("GET", "/windows/current", None, False),
    ("GET", "/windows/{window_id}", None, False),
    ("DELETE", "/windows/{window_id}", None, False),
    ("GET", "/windows/{window_id}/geometry", None, False),
    ("POST", "/windows/{window_id}/focus", None, False),
    ("POST", "/windows/{window_id}/maximize", None, False),
    ("POST", "/windows/{window_id}/minimize", None, False),
    ("POST", "/windows/{window_id}/restore", None, False),
    ("POST", "/windows/{window_id}/move", WindowMoveRequest, True),
    ("POST", "/windows/{window_id}/resize", WindowSizeRequest, True),
    ("GET", "/screens", None, False),
    ("POST", "/screens", ScreenSizeRequest, False),
    ("GET", "/screens/{screen_id}", None, False),
    ("DELETE", "/screens/{screen_id}", None, False),
    ("GET", "/screens/{screen_id}/connect", None, False),
    ("POST", "/screens/{screen_id}/resize", ScreenSizeRequest, False),
)

OPERATIONS: dict[tuple[str, str], Operation] = {
    # Not ready is the one 5xx in a fail envelope: ``data`` says which dependency is down (§11.1).
    ("GET", "/readyz"): Operation(
        bodies={
            503: {
                "type": "object",
                "required": ["status", "data"],
                "properties": {"status": {"const": "fail"}, "data": {"type": "object"}},
            }
        }
    ),
    ("POST", "/v1/sandboxes"): Operation(statuses=STARTS_COMPUTE),
    ("GET", "/v1/sandboxes"): Operation(query=(STATUS_FILTER,)),
    ("GET", "/v1/sandboxes/by-ip/{ip}"): Operation(statuses=(400,)),  # not an IP address
    ("GET", SANDBOX): Operation(query=WAIT),
    ("PATCH", SANDBOX): Operation(statuses=ON_A_SANDBOX, body=PatchSandboxRequest),
    ("DELETE", SANDBOX): Operation(statuses=ON_A_SANDBOX),
    ("POST", SANDBOX + "/pause"): Operation(statuses=ON_A_SANDBOX),
    ("POST", SANDBOX + "/resume"): Operation(statuses=STARTS_COMPUTE),
    ("POST", SANDBOX + "/fork"): Operation(statuses=STARTS_COMPUTE, body=ForkSandboxRequest),
    ("POST", SANDBOX + "/resize"): Operation(statuses=(403, *ON_A_SANDBOX)),
    ("POST", SANDBOX + "/ssh-pubkeys"): Operation(statuses=ON_A_SANDBOX, body=SshKeysRequest),
    ("GET", SANDBOX + "/egress"): Operation(),
    ("PUT", SANDBOX + "/egress"): Operation(statuses=ON_A_SANDBOX, body=EgressRequest),
    ("GET", SANDBOX + "/bandwidth"): Operation(statuses=ON_A_SANDBOX),
    # Metrics (§12.5, docs/observability.md): read from the database, never from the host.
    ("GET", SANDBOX + "/metrics"): Operation(),
    ("GET", "/v1/metrics"): Operation(),
    ("GET", "/v1/metrics/timeseries"): Operation(),
    # Logs (docs/observability.md): read from the sandbox's host; a container has no guest console (409).
    ("GET", SANDBOX + "/logs"): Operation(statuses=ON_A_SANDBOX),
    ("POST", SANDBOX + "/bandwidth/recharge"): Operation(
        statuses=(402, *ON_A_SANDBOX), body=RechargeRequest, body_required=True
    ),
    ("POST", SANDBOX + "/timeout"): Operation(statuses=(409,)),  # a destroyed sandbox has no lifetime
    ("POST", SANDBOX + "/exec"): Operation(
        statuses=ON_A_SANDBOX,
        body=ExecRequest,
        body_required=True,
        query=(STREAM,),
        media=("application/x-ndjson",),
    ),
    # 507: the sandbox's own disk is full (nothing was written). Both also open to a signed link's
    # ``expires`` and ``signature`` without a key (``sandboxes/file_urls.py``; a bad one is 401).
    ("PUT", SANDBOX + "/files"): Operation(
        statuses=(507, *ON_A_SANDBOX),
        raw_body="application/octet-stream",
        query=(GUEST_PATH, *SIGNED_LINK),
    ),
    ("GET", SANDBOX + "/files"): Operation(
        statuses=ON_A_SANDBOX,
        query=(GUEST_PATH, *SIGNED_LINK),
        media=("application/octet-stream",),
        unwrapped=True,
    ),
    ("POST", SANDBOX + "/files/url"): Operation(statuses=(404,), body=FileUrlRequest, body_required=True),
    # Files beyond one file's bytes, run inside the sandbox: a path that is missing 404, not a directory
    # (list, tar) or refused by the sandbox 400, already there as another kind (mkdir) 409.
    ("GET", SANDBOX + "/files/list"): Operation(statuses=ON_A_SANDBOX, query=(GUEST_PATH, DEPTH)),
    ("GET", SANDBOX + "/files/stat"): Operation(statuses=ON_A_SANDBOX, query=(GUEST_PATH,)),
    ("POST", SANDBOX + "/files/mkdir"): Operation(statuses=ON_A_SANDBOX, query=(GUEST_PATH,)),
    ("POST", SANDBOX + "/files/rename"): Operation(
        statuses=ON_A_SANDBOX,
        query=(guest_path("source", "the path to move"), guest_path("destination", "its new path")),
    ),
    ("DELETE", SANDBOX + "/files"): Operation(statuses=ON_A_SANDBOX, query=(GUEST_PATH,)),
    # The directory as one tar stream: up through the capped upload (507 as PUT /files), down as bytes.
    ("PUT", SANDBOX + "/files/tar"): Operation(
        statuses=(507, *ON_A_SANDBOX), raw_body="application/x-tar", query=(GUEST_PATH,)
    ),
    ("GET", SANDBOX + "/files/tar"): Operation(
        statuses=ON_A_SANDBOX, query=(GUEST_PATH,), media=("application/x-tar",), unwrapped=True
    ),
    # 429: the open watches of a sandbox or an account are capped (Retry-After).
    ("GET", SANDBOX + "/files/watch"): Operation(
        statuses=(429, *ON_A_SANDBOX),
        query=(GUEST_PATH, RECURSIVE),
        media=("application/x-ndjson",),
        unwrapped=True,
    ),
    # §12.1: the owner's key only (a token gets 403); create with an enabled token and rotate without
    # one are 409; a destroyed sandbox takes no new token (409).
    ("POST", SANDBOX + "/access-token"): Operation(statuses=(403, 409), body=AccessTokenRequest),
    ("GET", SANDBOX + "/access-token"): Operation(statuses=(403,)),
    ("POST", SANDBOX + "/access-token/rotate"): Operation(statuses=(403, 409), body=AccessTokenRequest),
    ("DELETE", SANDBOX + "/access-token"): Operation(statuses=(403,)),
    # §12.2: the sandbox must be running (409); a process that cannot do it now (no PTY, exited) 409.
    ("POST", SANDBOX + "/processes"): Operation(statuses=(403, *ON_A_SANDBOX), body=ProcessStartRequest),
    ("GET", SANDBOX + "/processes"): Operation(statuses=(403, *ON_A_SANDBOX)),
    ("GET", SANDBOX + "/processes/{process_id}"): Operation(statuses=(403, *ON_A_SANDBOX)),
    ("DELETE", SANDBOX + "/processes/{process_id}"): Operation(statuses=(403, *ON_A_SANDBOX)),
    ("GET", SANDBOX + "/processes/{process_id}/connect"): Operation(
        statuses=(403, *ON_A_SANDBOX), media=("application/x-ndjson",), unwrapped=True
    ),
    ("POST", SANDBOX + "/processes/{process_id}/input"): Operation(
        statuses=(403, *ON_A_SANDBOX), body=ProcessInputRequest, body_required=True
    ),
    ("POST", SANDBOX + "/processes/{process_id}/stdin/close"): Operation(statuses=(403, *ON_A_SANDBOX)),
    ("POST", SANDBOX + "/processes/{process_id}/resize"): Operation(
        statuses=(403, *ON_A_SANDBOX), body=ProcessResizeRequest
    ),
    ("POST", SANDBOX + "/processes/{process_id}/signal"): Operation(
        statuses=(403, *ON_A_SANDBOX), body=ProcessSignalRequest, body_required=True
    ),
    ("GET", SANDBOX + "/processes/{process_id}/wait"): Operation(statuses=(403, *ON_A_SANDBOX)),
    # §12.3: a desktop sandbox only (409 otherwise, or when not running); a bad screen or window id 400;
    # a window or screen that does not exist 404; a refused action on one (screen-0 delete, screens full)
    # 409.
    ("GET", SANDBOX + "/computer/screenshot"): Operation(
        statuses=(400, 403, 404, *ON_A_SANDBOX), media=("image/png",), unwrapped=True
    ),
    **{
        (method, SANDBOX + "/computer" + suffix): Operation(
            statuses=(400, 403, 404, *ON_A_SANDBOX), body=model, body_required=model is not None and required
        )
        for method, suffix, model, required in COMPUTER_OPERATIONS
    },
    ("POST", "/v1/networks"): Operation(statuses=(403, 409), body=NetworkCreateRequest),
    ("DELETE", "/v1/networks/{network_id}"): Operation(statuses=(409,)),
    ("POST", SANDBOX + "/networks"): Operation(
        statuses=(403, *ON_A_SANDBOX), body=NetworkAttachRequest, body_required=True
    ),
    ("DELETE", SANDBOX + "/networks/{network_id}"): Operation(statuses=ON_A_SANDBOX),
    ("POST", "/v1/webhook-endpoints"): Operation(statuses=(403,)),
    # Disks (§11.10, §11.11): plan and credit on create, a duplicate name 409, delete while mounted 409;
    # attach meets the plan, the sandbox's state and its host.
    ("POST", "/v1/disks"): Operation(statuses=(402, 403, 409), body=DiskCreateRequest, body_required=True),
    ("PATCH", "/v1/disks/{ref}"): Operation(body=DiskPatchRequest, body_required=True),
    ("DELETE", "/v1/disks/{ref}"): Operation(statuses=(409,)),
    ("POST", SANDBOX + "/disks"): Operation(
        statuses=(403, *ON_A_SANDBOX), body=DiskAttachment, body_required=True
    ),
    ("DELETE", SANDBOX + "/disks/{disk_id}"): Operation(statuses=ON_A_SANDBOX),
    # Templates (§11.13): plan and credit on create, a duplicate name 409; the log is NDJSON only.
    ("POST", "/v1/templates"): Operation(
        statuses=(402, 403, 409), body=TemplateCreateRequest, body_required=True
    ),
    ("GET", "/v1/templates/{ref}/logs"): Operation(media=("application/x-ndjson",), unwrapped=True),
    # Snapshots (docs/snapshots.md): plan and credit, a duplicate name or a tier without them 409, copies
    # of its volumes (include_volumes) the host has no room for 507.
    ("POST", SANDBOX + "/snapshots"): Operation(
        statuses=(402, 403, 507, *ON_A_SANDBOX), body=SnapshotCreateRequest
    ),
    ("DELETE", "/v1/snapshots/{ref}"): Operation(statuses=(409,)),
    # Local volumes (docs/volumes.md): plan and credit on create, a duplicate name or a tier without them
    # 409; resize grows only; delete while attached 409; a second writer, another host or tier 409.
    ("POST", "/v1/volumes"): Operation(
        statuses=(402, 403, 409, 503, 507), body=VolumeCreateRequest, body_required=True
    ),
    ("PATCH", "/v1/volumes/{ref}"): Operation(
        statuses=(403, 409, 503, 507), body=VolumeResizeRequest, body_required=True
    ),
    ("DELETE", "/v1/volumes/{ref}"): Operation(statuses=(409, 503)),
    ("POST", SANDBOX + "/volumes"): Operation(
        statuses=ON_A_SANDBOX, body=VolumeAttachment, body_required=True
    ),
    ("DELETE", SANDBOX + "/volumes/{volume_id}"): Operation(statuses=ON_A_SANDBOX),
    # A volume's files without a sandbox (resources/volume_files.py): a missing path 404, a path through a
    # symlink or of the wrong kind 400, a volume not ready or a VM holding it 409, over 64 MiB 413.
    ("PUT", "/v1/volumes/{ref}/files"): Operation(
        statuses=(409, 413, 503), raw_body="application/octet-stream", query=(GUEST_PATH,)
    ),
    ("GET", "/v1/volumes/{ref}/files"): Operation(
        statuses=(409, 413, 503), query=(GUEST_PATH,), media=("application/octet-stream",), unwrapped=True
    ),
    ("GET", "/v1/volumes/{ref}/files/list"): Operation(statuses=(409, 413, 503), query=(GUEST_PATH, DEPTH)),
    ("GET", "/v1/volumes/{ref}/files/stat"): Operation(statuses=(409, 503), query=(GUEST_PATH,)),
    ("POST", "/v1/volumes/{ref}/files/mkdir"): Operation(statuses=(409, 503), query=(GUEST_PATH,)),
    ("DELETE", "/v1/volumes/{ref}/files"): Operation(statuses=(409, 503), query=(GUEST_PATH,)),
    # The audit trail (docs/audit.md): a page of events, or all of them as JSON lines.
    ("GET", SANDBOX + "/audit"): Operation(query=AUDIT_QUERY, media=("application/x-ndjson",)),
}

CONTRACT = Contract(
    fail_schema=JSEND_FAIL,
    error_schema=JSEND_ERROR,
    success_schema=JSEND_SUCCESS,
    common_statuses=(500,),
    operations=OPERATIONS,
    security_scheme=("ApiKey", {"type": "apiKey", "in": "header", "name": "X-Api-Key"}),
    public=frozenset({"/healthz", "/readyz", "/v1/shapes", "/v1/rootfs"}),
    # A delegated sandbox access token (§12.1) is refused with 403 FORBIDDEN wherever it may not act.
    authenticated_statuses=(401, 403),
    # Any body: over its cap 413 (an exec's names stdin; an upload's is max_upload_bytes), too slow 408.
    body_statuses=(408, 413),
    # A path parameter holding NUL is a 400 naming it (BoundaryRoute), before the lookup's 404.
    path_statuses=(400,),
)
