"""Import rules between the deliverables (ARCHITECTURE.md): services never reach into each other."""

from __future__ import annotations

import ast
import sys
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


#: The host agent's modules the control plane loads: the client, the contract, the kept channel.
HOST_CLIENT_SIDE = ("client", "schemas", "channelclient", "channelwire")


#: paddock_core modules the host contract may import: each imports the standard library only, and at
#: most the client libraries the contract itself uses (checked below).
PURE_CORE: dict[str, set[str]] = {"paddock_core.s3config": set(), "paddock_core.tls": {"httpx"}}


def test_pure_core_modules_import_only_the_standard_library() -> None:
    for module, clients in PURE_CORE.items():
        tree = ast.parse((SRC / "paddock_core" / f"{module.rsplit('.', 1)[1]}.py").read_text())
        for node in ast.walk(tree):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            for name in names:
                root = name.split(".")[0]
                assert root in sys.stdlib_module_names or root in clients, f"{module} imports {name}"


def test_host_contract_needs_no_server() -> None:
    """The control plane imports the host agent's contract and client: they (and the kept channel's
    client and frames) import pydantic, the HTTP clients and the standard library, never the host
    agent's server side (drivers, FastAPI, the guest)."""
    allowed_roots = {"__future__", "asyncio", "collections", "contextlib", "dataclasses", "datetime"}
    allowed_roots |= {"ipaddress"}
    allowed_roots |= {"itertools", "json", "struct", "time", "typing", "urllib"}
    allowed_roots |= {"pydantic", "aiohttp", "httpx"}
    own = {f"paddock_hostagent.{name}" for name in HOST_CLIENT_SIDE}
    # paddock_core modules that import no server side: input checks both sides share, the TLS context.
    own |= set(PURE_CORE)
    for name in HOST_CLIENT_SIDE:
        tree = ast.parse((SRC / "paddock_hostagent" / f"{name}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in ("paddock_hostagent", "paddock_core"):
                modules = {f"{node.module}.{alias.name}" for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                modules = {node.module}
            elif isinstance(node, ast.Import):
                modules = {alias.name for alias in node.names}
            else:
                continue
            for module in modules:
                assert module.split(".")[0] in allowed_roots or module in own, (
                    f"paddock_hostagent/{name}.py imports {module}"
                )


# --- inside the control plane -------------------------------------------------------------------

CONTROL_PLANE = SRC / "paddock_controlplane"

#: file (relative to src/) → modules it may import inside a function: optional dependencies, loaded
#: only when the feature that needs them runs. An import inside a function to dodge a cycle is not
#: one of these; break the cycle instead.
LAZY_IMPORTS: dict[str, set[str]] = {}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """The module-level imports that run when the module is imported (``if TYPE_CHECKING:`` ones do not)."""
    out: list[ast.Import | ast.ImportFrom] = []
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            out.append(node)
        elif isinstance(node, ast.If | ast.Try) and not (
            isinstance(node, ast.If) and _is_type_checking(node)
        ):
            out.extend(n for n in ast.walk(node) if isinstance(n, ast.Import | ast.ImportFrom))
    return out


def control_plane_graph() -> dict[str, set[str]]:
    """Module → the control-plane modules it imports at import time (``from pkg import mod`` is ``pkg.mod``
    when ``mod`` is a module; importing ``a.b.c`` also runs ``a.b``'s ``__init__``, which is left out:
    it is the package, not a dependency the code chose)."""
    modules = {_module_name(path): path for path in CONTROL_PLANE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges: set[str] = set()
        for node in _runtime_imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                edges.update(alias.name for alias in node.names if alias.name in modules)
            elif node.module and node.level == 0:
                for alias in node.names:
                    submodule = f"{node.module}.{alias.name}"
                    if submodule in modules:
                        edges.add(submodule)
                    elif node.module in modules:
                        edges.add(node.module)
        edges.discard(name)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path ``[a, b, …, a]``, or ``None``."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


def test_the_control_plane_has_no_import_cycle() -> None:
    graph = control_plane_graph()
    # The graph is real: the modules that used to form the cycle are in it, with their edges.
    assert "paddock_controlplane.resources.networks" in graph["paddock_controlplane.sandboxes.lifecycle"]
    assert "paddock_controlplane.records.queries" in graph["paddock_controlplane.resources.networks"]
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(cycle or [])


def test_find_cycle_finds_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_inside_a_function_in_the_control_plane() -> None:
    offences = []
    for path in CONTROL_PLANE.rglob("*.py"):
        relative = str(path.relative_to(SRC))
        tree = ast.parse(path.read_text(), str(path))
        module_level = {id(node) for node in _runtime_imports(tree)}
        for node in tree.body:
            if isinstance(node, ast.If) and _is_type_checking(node):
                module_level.update(id(n) for n in ast.walk(node))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom) and id(node) not in module_level:
                if isinstance(node, ast.Import):
                    names = {alias.name for alias in node.names}
                else:
                    names = {f"{node.module}.{alias.name}" for alias in node.names}
                if not all(allowed(name, LAZY_IMPORTS.get(relative, set())) for name in names):
                    offences.append(f"{relative}:{node.lineno} imports {', '.join(sorted(names))}")
    assert not offences, "\n".join(offences)


# --- roles inside the control plane (ARCHITECTURE.md, "The control plane's folders") -------------

#: Role folder → the roles its modules may import, type-only and function-level imports included. A
#: request enters at ``edge``, is decided in ``sandboxes``/``resources``/``hosts`` and is recorded in
#: ``records``; ``workers`` run beside the requests and call the same deciding modules. Nothing imports
#: ``edge`` or ``workers`` but the composition root, and ``records`` imports no other role.
ROLES: dict[str, set[str]] = {
    "records": set(),
    "hosts": {"records"},
    "resources": {"records", "hosts"},
    "sandboxes": {"records", "hosts", "resources"},
    "workers": {"records", "hosts", "resources", "sandboxes"},
    "edge": {"records", "hosts", "resources", "sandboxes"},
}
#: The modules at the package's top: the composition root (``app``, ``main``, which wire every role
#: and are imported by none) and ``settings`` (imports no role; every role may read it).
TOP_LEVEL = {"__init__", "app", "main", "settings"}
ROOT_ONLY = {"paddock_controlplane.app", "paddock_controlplane.main"}


def _role(module: str) -> str | None:
    """``paddock_controlplane.<role>`` and ``paddock_controlplane.<role>.…`` → ``<role>``; a top-level
    module (``app``, ``settings`` …) has none."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] not in TOP_LEVEL else None


def control_plane_imports() -> dict[str, set[str]]:
    """Module → every control-plane module it imports anywhere: at import time, under
    ``if TYPE_CHECKING:`` and inside functions (``from pkg import mod`` is ``pkg.mod`` when ``mod`` is
    a module)."""
    return package_imports(CONTROL_PLANE)


def package_imports(root: Path) -> dict[str, set[str]]:
    """Module → every module of the package at ``root`` it imports anywhere (see above)."""
    modules = {_module_name(path): path for path in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                edges.update(alias.name for alias in node.names if alias.name in modules)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    submodule = f"{node.module}.{alias.name}"
                    if submodule in modules:
                        edges.add(submodule)
                    elif node.module in modules:
                        edges.add(node.module)
        edges.discard(name)
        graph[name] = edges
    return graph


def role_offences(graph: dict[str, set[str]]) -> list[str]:
    offences = []
    for module, imports in sorted(graph.items()):
        role = _role(module)
        if role is not None and role not in ROLES:
            offences.append(f"{module} is outside the role folders ({', '.join(ROLES)})")
        for target in sorted(imports):
            if role is not None and target in ROOT_ONLY:
                offences.append(f"{module} imports {target}, the composition root")
            elif role is None and module == "paddock_controlplane.settings":
                offences.append(f"{module} imports {target}: settings imports no role")
            elif (
                role is not None
                and (other := _role(target)) is not None
                and other != role
                and other not in ROLES.get(role, set())
            ):
                offences.append(f"{module} ({role}) imports {target} ({other})")
    return offences


def test_each_role_imports_only_the_roles_below_it() -> None:
    graph = control_plane_imports()
    # The graph is real: the create path's edges between roles are in it.
    assert (
        "paddock_controlplane.sandboxes.lifecycle" in graph["paddock_controlplane.edge.api.routes.sandboxes"]
    )
    assert "paddock_controlplane.hosts.hostlink" in graph["paddock_controlplane.sandboxes.lifecycle"]
    assert "paddock_controlplane.records.models" in graph["paddock_controlplane.hosts.hostlink"]
    offences = role_offences(graph)
    assert not offences, "\n".join(offences)


def test_role_rules_catch_an_import_upwards() -> None:
    graph = {
        "paddock_controlplane.records.models": {"paddock_controlplane.sandboxes.lifecycle"},
        "paddock_controlplane.sandboxes.lifecycle": {"paddock_controlplane.edge.api.deps"},
        "paddock_controlplane.hosts.hostlink": {"paddock_controlplane.app"},
        "paddock_controlplane.stray": set(),
    }
    assert role_offences(graph) == [
        "paddock_controlplane.hosts.hostlink imports paddock_controlplane.app, the composition root",
        "paddock_controlplane.records.models (records) imports paddock_controlplane.sandboxes.lifecycle (sandboxes)",
        "paddock_controlplane.sandboxes.lifecycle (sandboxes) imports paddock_controlplane.edge.api.deps (edge)",
        "paddock_controlplane.stray is outside the role folders (records, hosts, resources, sandboxes, workers, edge)",
    ]


def test_the_control_plane_has_no_import_cycle_even_type_only() -> None:
    """No circle through ``if TYPE_CHECKING:`` or function-level imports either: a type-only circle is
    still two modules that cannot be understood apart."""
    graph = control_plane_imports()
    assert "paddock_controlplane.records.services" in graph["paddock_controlplane.hosts.hostlink"]
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(cycle or [])


# -- the host agent's drivers, by kernel concern ------------------------------------------------------

HOST_AGENT = SRC / "paddock_hostagent"
DRIVERS = "paddock_hostagent.drivers"
#: Concern folder under ``drivers/`` → the concerns it may import (``base``, the driver Protocol, is open
#: to all). ``system`` (commands, host processes, namespace threads) is what every concern runs on;
#: ``storage`` reads only the netns directory's name from ``net``; the runtime and the VM tier compose
#: the others, and nothing in ``drivers/`` imports the agent above it (its sandboxes, routes, app).
DRIVER_CONCERNS: dict[str, set[str]] = {
    "system": set(),
    "net": {"system"},
    "storage": {"system", "net"},
    "build": {"system", "storage"},
    "runtime": {"system", "net", "storage"},
    "vm": {"system", "net"},
}
#: What ``drivers/`` may import of the agent outside it: the in-sandbox guest agent's client.
DRIVERS_MAY_REACH = ("paddock_hostagent.guest",)


def driver_offences(graph: dict[str, set[str]]) -> list[str]:
    offences = []
    for module, imports in sorted(graph.items()):
        if not module.startswith(DRIVERS + "."):
            continue
        concern = module.split(".")[2]
        if concern not in DRIVER_CONCERNS and concern != "base":
            offences.append(f"{module} is outside the concern folders ({', '.join(DRIVER_CONCERNS)})")
        for target in sorted(imports):
            if target == DRIVERS or target == f"{DRIVERS}.base":
                continue
            if not target.startswith(DRIVERS + "."):
                if not target.startswith(DRIVERS_MAY_REACH):
                    offences.append(f"{module} imports {target}, the agent above the drivers")
                continue
            other = target.split(".")[2]
            if other != concern and other not in DRIVER_CONCERNS.get(concern, set()):
                offences.append(f"{module} ({concern}) imports {target} ({other})")
    return offences


def test_each_driver_concern_imports_only_the_concerns_below_it() -> None:
    graph = package_imports(HOST_AGENT)
    # The graph is real: the runtime's edges to the concerns it composes are in it.
    runtime = graph["paddock_hostagent.drivers.runtime.oci"]
    assert any(target.startswith("paddock_hostagent.drivers.storage") for target in runtime)
    assert any(target.startswith("paddock_hostagent.drivers.net") for target in runtime)
    offences = driver_offences(graph)
    assert not offences, "\n".join(offences)


def test_driver_rules_catch_an_import_upwards() -> None:
    graph = {
        "paddock_hostagent.drivers.system.commands": {"paddock_hostagent.drivers.net.network"},
        "paddock_hostagent.drivers.net.network": {"paddock_hostagent.sandboxes.manager"},
        "paddock_hostagent.drivers.vm.qemu": {
            "paddock_hostagent.guest.client",
            "paddock_hostagent.drivers.base",
        },
    }
    assert driver_offences(graph) == [
        "paddock_hostagent.drivers.net.network imports paddock_hostagent.sandboxes.manager, the agent above the drivers",
        "paddock_hostagent.drivers.system.commands (system) imports paddock_hostagent.drivers.net.network (net)",
    ]


def test_the_host_agent_has_no_import_cycle_even_type_only() -> None:
    cycle = find_cycle(package_imports(HOST_AGENT))
    assert cycle is None, " -> ".join(cycle or [])
