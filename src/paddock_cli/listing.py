"""What ``paddock --help`` lists of the commands that live in other modules, without importing them:
each command's module and its help. Pure data, so main.py can list every command at start-up and each
command group's module takes its help from here."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Lazy:
    """A command of ``paddock`` defined in another module, imported only when the command runs."""

    target: str  # "module:attribute": a typer.Typer (a command group) or a command's function
    help: str  # what ``paddock --help`` lists: the first paragraph of the command's own help


#: The commands listed before the ones defined in main.py, then the command groups listed after them (the
#: order ``paddock --help`` has always shown). A group's help is its Typer's (each module reads it from
#: here: one source); a command's is restated from the first paragraph of its docstring, which
#: tests/cli/test_cli_startup.py checks agree.
LAZY_FIRST: dict[str, Lazy] = {
    "whoami": Lazy("paddock_cli.more:whoami", "Who the API key belongs to, what runs, and the credits left."),
    "shapes": Lazy("paddock_cli.more:shapes", "The sandbox shapes (vCPU, memory, default disk, price)."),
    "rootfs": Lazy("paddock_cli.more:rootfs", "The root images a sandbox can boot, and the default."),
    "hosts": Lazy(
        "paddock_cli.more:hosts",
        "The hosts sandboxes are placed on: status, free memory, sandboxes and labels.",
    ),
    "metrics": Lazy(
        "paddock_cli.more:account_metrics", "The account's use now, summed over its running sandboxes."
    ),
}
LAZY_GROUPS: dict[str, Lazy] = {
    # more.py adds its sandbox commands (egress, resize, set, bandwidth, metrics, boot-log, ssh-key, ps,
    # logs, wait, kill) to sandbox.py's app on import.
    "sandbox": Lazy("paddock_cli.more:sandbox.app", "Create, use and destroy sandboxes."),
    "network": Lazy(
        "paddock_cli.network:app",
        "Private networks between your sandboxes: create, list, inspect, attach, detach, delete.",
    ),
    "webhook": Lazy("paddock_cli.webhook:app", "Webhook endpoints: register, list, inspect, pause, delete."),
    "disk": Lazy("paddock_cli.disk:app", "S3 disks: register, list, mount into sandboxes, detach, delete."),
    "template": Lazy("paddock_cli.template:app", "Templates: build a Dockerfile into a bootable image."),
    "volume": Lazy(
        "paddock_cli.volume:app",
        "Local persistent volumes that outlive sandboxes: create, list, inspect, resize, delete.",
    ),
    "deploy": Lazy(
        "paddock_cli.deploy:app",
        "Deploy a directory through the payment gateway (deploy DIR), or list, show and delete the "
        "wallet's projects (deploy ls | status NAME | rm NAME).",
    ),
    "wallet-sandbox": Lazy(
        "paddock_cli.wallet_sandbox:app",
        "Sandboxes rented by a wallet alone, paid by x402: create, list, pause, resume, delete.",
    ),
    "admin": Lazy("paddock_cli.admin:app", "Accounts and API keys (talks to the database directly)."),
}
LAZY: dict[str, Lazy] = {**LAZY_FIRST, **LAZY_GROUPS}
