"""Import rules between the deliverables (ARCHITECTURE.md): services never reach into each other."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"

#: package → the paddock packages (or single modules) it may import.
ALLOWED: dict[str, set[str]] = {
    "paddock": {"paddock"},
    "paddock_core": {"paddock_core"},
    # The host agent's client and the contract it shares with the host agent's routes, nothing else.
    "paddock_controlplane": {
        "paddock_controlplane",
        "paddock_core",
        "paddock_hostagent.client",
        "paddock_hostagent.schemas",
    },
    "paddock_hostagent": {"paddock_hostagent", "paddock_core"},
    "paddock_gateway": {"paddock_gateway", "paddock_core", "paddock"},
}


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports; ``from pkg import mod`` counts as ``pkg.mod``."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {n for n in names if n.split(".")[0].startswith("paddock")}


def allowed(name: str, rules: set[str]) -> bool:
    top = name.split(".")[0]
    return top in rules or any(name == r or name.startswith(r + ".") for r in rules if "." in r)


def test_each_service_imports_only_what_it_may() -> None:
    offences = []
    for package, rules in ALLOWED.items():
        for path in (SRC / package).rglob("*.py"):
            for name in imported_modules(path):
                if not allowed(name, rules):
                    offences.append(f"{path.relative_to(SRC)} imports {name}")
    assert not offences, "\n".join(offences)


def test_sdk_has_no_server_imports() -> None:
    third_party = set()
    for path in (SRC / "paddock").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                third_party.add(node.module.split(".")[0])
            elif isinstance(node, ast.Import):
                third_party.update(a.name.split(".")[0] for a in node.names)
    assert not third_party & {"fastapi", "sqlalchemy", "uvicorn", "structlog", "pydantic_settings", "alembic"}


def test_host_contract_needs_no_server() -> None:
    """The control plane imports the host agent's contract and client: they import pydantic and the
    HTTP clients, never the host agent's server side (drivers, FastAPI, the guest)."""
    allowed_roots = {"__future__", "collections", "contextlib", "ipaddress", "json", "typing", "urllib"}
    allowed_roots |= {"pydantic", "aiohttp", "httpx"}
    for name in ("client.py", "schemas.py"):
        tree = ast.parse((SRC / "paddock_hostagent" / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                modules = {node.module}
            elif isinstance(node, ast.Import):
                modules = {alias.name for alias in node.names}
            else:
                continue
            for module in modules:
                assert module.split(".")[0] in allowed_roots or module == "paddock_hostagent.schemas", (
                    f"paddock_hostagent/{name} imports {module}"
                )
