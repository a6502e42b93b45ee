"""Control-plane settings (env prefix ``PADDOCK_CP_``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from paddock_core.settings import DEFAULT_DATA_DIR, DatabaseSettingsMixin, ServiceSettings, sqlite_url


class ControlPlaneSettings(DatabaseSettingsMixin, ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="PADDOCK_CP_", extra="ignore")

    port: int = 8080
    data_dir: Path = DEFAULT_DATA_DIR
    region: Literal["eu", "us"] = "eu"
    #: Shared bearer token between the control plane and its host agents.
    host_token: SecretStr = SecretStr("")
    #: Key material for secrets at rest (env values, webhook secrets, disk credentials).
    secret_key: SecretStr = SecretStr("")
    #: Catalog default when ``rootfs`` is omitted and no host can build ``alpine:3.20``.
    default_rootfs: str = "debian:13"
    #: Ingress URLs are ``<ingress_scheme>://<port>-<sandbox id>.<ingress_domain>[:<public port>]``.
    ingress_domain: str = "sandbox.localhost"
    ingress_scheme: Literal["http", "https"] = "https"
    #: The ingress proxy's plain-HTTP listener in this process (0: no listener here).
    ingress_port: int = 0
    #: Its HTTPS listener (0: none); needs ``ingress_tls_cert_file`` and ``ingress_tls_key_file``.
    ingress_tls_port: int = 0
    #: PEM certificate chain (a wildcard ``*.<ingress_domain>``) and its key, re-read when they change.
    ingress_tls_cert_file: Path | None = None
    ingress_tls_key_file: Path | None = None
    #: The port written into ingress URLs. Default: this process's listener for ``ingress_scheme``.
    #: Left out of URLs when it is the scheme's default (80/443), e.g. behind a load balancer on 443.
    ingress_public_port: int | None = None
    #: Address the ingress listeners bind (the API's ``host`` when empty).
    ingress_host: str = ""
    #: The SSH gateway's port in this process (0: none; ``paddock serve`` uses 2222), its address (the
    #: API's ``host`` when empty) and its host key (generated once; default ``<data_dir>/ssh_host_key``).
    ssh_port: int = 0
    ssh_host: str = ""
    ssh_host_key_file: Path | None = None
    #: The E2B-compatible control API's listener in this process (0: none; ``paddock serve`` uses 3000),
    #: its address (the API's ``host`` when empty) and the ``domain`` it tells the SDK (the ingress's
    #: when empty). See docs/e2b.md.
    e2b_port: int = 0
    e2b_host: str = ""
    e2b_domain: str = ""
    #: The E2B sandbox edge's listener (envd, the code interpreter, user ports; 0: none; ``paddock
    #: serve`` uses 49983), reached by the SDK through ``E2B_SANDBOX_URL``.
    e2b_edge_port: int = 0
    #: How long a request waits for a paused, creating or resuming sandbox to be running.
    ingress_wake_timeout_s: float = 30.0
    #: Dialling a sandbox port fails after this long (-> 502).
    ingress_connect_timeout_s: float = 5.0
    #: An idle keep-alive client connection is closed after this long.
    ingress_idle_timeout_s: float = 75.0
    #: Plan given to users created without an explicit plan.
    default_plan: str = "pro"
    #: Credits given to each new account (500, per the seed). 100 credits = 1 USD.
    signup_credits: int = 500
    #: A host that has not heartbeated for this long is ``dead``.
    host_dead_after_s: float = 15.0
    #: Seconds between reconciler / billing passes.
    reconcile_interval_s: float = 1.0
    #: Seconds between billing settlements of running sandboxes.
    billing_interval_s: float = 10.0
    #: How long auth and running-sandbox lookups are cached in process (revocations apply within it).
    hot_cache_ttl_s: float = 1.0
    #: Largest accepted file upload.
    max_upload_bytes: int = 1 << 30
    #: Largest buffered exec output per stream before truncation.
    max_exec_output_bytes: int = 16 << 20
    #: Egress budget every new sandbox (and fork) starts with; -1 means unmetered (§11.7: 5 GiB).
    default_bandwidth_quota_bytes: int = 5 * 1024**3
    #: Boot deadline for create.
    boot_timeout_s: float = 45.0
    #: Boot deadline for a create or fork on a VM host (qemu): a TCG boot on a loaded host takes far
    #: longer than a container's, and the host's own deadline (``PADDOCK_HOST_VM_BOOT_TIMEOUT_S``, 60 s
    #: for the guest to answer, after its disk is made) must end first, so that its reason is the one a
    #: caller reads, and a boot the host would finish is not abandoned.
    vm_boot_timeout_s: float = Field(default=120.0, gt=0)
    #: How long destroyed/failed rows stay readable.
    retention_destroyed_h: int = 24
    #: The audit trail (docs/audit.md): events older than this go, and each sandbox keeps its newest
    #: ``audit_max_events_per_sandbox``; a destroyed sandbox's trail stays readable until then.
    audit_retention_days: float = Field(default=7.0, gt=0)
    audit_max_events_per_sandbox: int = Field(default=100_000, ge=1)
    #: How often queued events are written (sooner once 500 wait), hosts polled for egress attempts,
    #: and retention enforced.
    audit_flush_interval_s: float = Field(default=0.5, gt=0)
    audit_egress_poll_s: float = Field(default=2.0, gt=0)
    audit_prune_interval_s: float = Field(default=60.0, gt=0)
    #: Deliver webhooks to loopback, private and link-local addresses (off: refused as SSRF).
    webhook_allow_private_targets: bool = False
    #: Let disks use S3 endpoints on loopback, private and link-local addresses (off: refused, since s3fs
    #: runs on the host's network and would reach the host's own services for a user).
    disk_allow_private_endpoints: bool = False
    #: Run the template build worker in this process (it drives builds on the hosts).
    template_worker_enabled: bool = True
    #: One build attempt's time limit; past it the attempt fails saying so.
    template_build_timeout_s: float = 1800.0
    #: Attempts per build (a failed one is retried until this many have run).
    template_build_attempts: int = 2
    #: What a build's RUN steps may use (cgroup limits set by buildah through the OCI runtime).
    template_build_vcpu: int = 2
    template_build_mem_mib: int = 2048
    #: The size of each account's builder filesystem on a host (its images and layer cache): what a
    #: RUN step sees as its disk; writing past it fails with "No space left on device".
    template_build_disk_mib: int = Field(default=10240, ge=1024)
    #: The egress allowlist of RUN steps, in the sandbox rule syntax (empty: open, as a new sandbox's).
    template_build_egress: list[str] = Field(default_factory=list)
    #: Seconds between pulls of every host's per-sandbox stats into the metrics tables (0: no pulls in
    #: this process; docs/observability.md). Raw samples are kept an hour, one-minute rollups a day.
    metrics_interval_s: float = Field(default=10.0, ge=0)
    #: Run the webhook delivery worker in this process (API-only processes may turn it off).
    webhook_worker_enabled: bool = True
    #: Webhook deliveries in flight at once per process.
    webhook_concurrency: int = 16
    #: Seconds between polls for due deliveries (local events wake the worker at once).
    webhook_poll_interval_s: float = 0.5
    #: A claimed delivery belongs to its worker this long, renewed every third of it while the worker
    #: lives; a dead worker's claims are taken over by another within this (plus one poll).
    webhook_lease_s: float = Field(default=10.0, gt=0)
    #: Per-attempt limit, from resolving the host to the response status (§11.15).
    webhook_timeout_s: float = 10.0
    #: Private networks take their address blocks from this pool (host agents drop routed traffic to it).
    network_pool: str = "10.96.0.0/11"
    #: Size of each private network's block; members get addresses from it.
    network_prefixlen: int = 24
    #: How long a desktop live-view link from ``GET …/computer/screens/{id}/connect`` opens the viewer.
    desktop_connect_ttl_s: int = Field(default=300, ge=5, le=86400)

    @field_validator("host_token", "secret_key")
    @classmethod
    def _not_placeholder(cls, value: SecretStr, info: object) -> SecretStr:
        if value.get_secret_value():
            return cls.reject_placeholder(value, getattr(info, "field_name", "secret"))
        return value

    @model_validator(mode="after")
    def _defaults(self) -> ControlPlaneSettings:
        if not self.database_url:
            self.database_url = sqlite_url(self.data_dir / "controlplane.db")
        if self.ingress_tls_port and not (self.ingress_tls_cert_file and self.ingress_tls_key_file):
            raise ValueError("ingress_tls_port needs ingress_tls_cert_file and ingress_tls_key_file")
        return self

    @property
    def ingress_url_domain(self) -> str:
        """The host part of ingress URLs after ``<port>-<id>.``: the domain, plus a port unless default."""
        port = self.ingress_public_port
        if port is None:
            port = self.ingress_tls_port if self.ingress_scheme == "https" else self.ingress_port
        default = 443 if self.ingress_scheme == "https" else 80
        if not port or port == default:
            return self.ingress_domain
        return f"{self.ingress_domain}:{port}"
