"""Every route of the contract (§5). Each parses its input, calls one domain function, returns a schema."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel

from paddock_gateway import agent_sandboxes, deployments, extend, lookups, projects
from paddock_gateway.api.deps import CallerDep, ManagerDep, ServicesDep
from paddock_gateway.schemas import (
    BalanceBody,
    ChainsBody,
    DeployAccepted,
    DeploymentStatusBody,
    DeployRequest,
    ErrorBody,
    ExtendAccepted,
    ExtendRequest,
    Health,
    ProjectDeleted,
    ProjectList,
    RecipientsBody,
)

router = APIRouter()


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": ErrorBody} for status in statuses}


WALLET_HEADERS = [
    {"name": name, "in": "header", "required": True, "schema": {"type": "string"}}
    for name in ("X-Wallet-Address", "X-Signature", "X-Timestamp", "X-Nonce")
]
#: Where a paying wallet manages its projects: the seed's headers, or x402's SIGN-IN-WITH-X instead.
MANAGER_HEADERS = [{**header, "required": False} for header in WALLET_HEADERS] + [
    {"name": "SIGN-IN-WITH-X", "in": "header", "required": False, "schema": {"type": "string"}}
]
PAYMENT_SIGNATURE_HEADER = {
    "name": "PAYMENT-SIGNATURE",
    "in": "header",
    "required": False,
    "schema": {"type": "string"},
}
DEPLOY_HEADERS = [
    {"name": name, "in": "header", "required": False, "schema": {"type": "string"}}
    for name in (
        "X-Payment-Tx",
        "X-Payment-Chain",
        "X-Payment-Token",
        "X-Use-Existing-Credits",
        "PAYMENT-SIGNATURE",
    )
]


@router.get("/health", response_model=Health)
async def health() -> Health:
    return Health()


@router.post(
    "/agent/deploy",
    response_model=DeployAccepted,
    responses=errors(400, 401, 402, 409, 413, 429, 500, 502, 503),
    openapi_extra={
        "parameters": WALLET_HEADERS + DEPLOY_HEADERS,
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/DeployRequest"}}},
        },
    },
)
async def deploy(
    request: Request, response: Response, services: ServicesDep, caller: CallerDep
) -> DeployAccepted:
    body = await request.body()
    deployed = await deployments.deploy(
        services, caller, body, request.headers.get("content-type"), request.headers
    )
    response.headers.update(deployed.headers)  # PAYMENT-RESPONSE after an x402 settlement
    return deployed.body


@router.get(
    "/agent/deploy/{projectId}/{deploymentId}/status",
    response_model=DeploymentStatusBody,
    response_model_exclude_none=True,
    responses=errors(401, 403, 404, 429, 502),
    openapi_extra={"parameters": MANAGER_HEADERS},
)
async def deployment_status(
    projectId: str, deploymentId: str, request: Request, services: ServicesDep, caller: ManagerDep
) -> DeploymentStatusBody:
    request.scope["state"]["resource_id"] = deploymentId
    return await projects.deployment_status(services, caller, projectId, deploymentId)


@router.get(
    "/agent/projects",
    response_model=ProjectList,
    responses=errors(401, 429, 502),
    openapi_extra={"parameters": MANAGER_HEADERS},
)
async def list_projects(services: ServicesDep, caller: ManagerDep) -> ProjectList:
    return await projects.list_projects(services, caller)


@router.delete(
    "/agent/projects/{projectId}",
    response_model=ProjectDeleted,
    responses=errors(401, 403, 404, 429, 500),
    openapi_extra={"parameters": MANAGER_HEADERS},
)
async def delete_project(
    projectId: str, request: Request, services: ServicesDep, caller: ManagerDep
) -> ProjectDeleted:
    request.scope["state"]["resource_id"] = projectId
    return await projects.delete_project(services, caller, projectId)


@router.post(
    "/agent/projects/{projectId}/extend",
    response_model=ExtendAccepted,
    responses=errors(400, 401, 402, 403, 404, 409, 429, 502, 503),
    openapi_extra={
        "parameters": [*MANAGER_HEADERS, PAYMENT_SIGNATURE_HEADER],
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ExtendRequest"}}},
        },
    },
)
async def extend_project(
    projectId: str, request: Request, response: Response, services: ServicesDep, caller: ManagerDep
) -> ExtendAccepted:
    request.scope["state"]["resource_id"] = projectId
    body = await request.body()
    accepted, headers = await extend.extend(
        services, caller, projectId, body, request.headers.get("content-type"), request.headers
    )
    response.headers.update(headers)  # PAYMENT-RESPONSE
    return accepted


@router.get("/agent/balance/{address}", response_model=BalanceBody, responses=errors(400, 429, 502))
async def balance(address: str, services: ServicesDep, chain: str | None = None) -> BalanceBody:
    return await lookups.balance(services, address, chain)


@router.get("/agent/chains", response_model=ChainsBody, responses=errors(429))
async def chains(services: ServicesDep) -> ChainsBody:
    return lookups.chains(services)


@router.get("/agent/recipients", response_model=RecipientsBody, responses=errors(429))
async def recipients(services: ServicesDep) -> RecipientsBody:
    return lookups.recipients(services)


EXTRA_SCHEMAS: dict[str, type[BaseModel]] = {"DeployRequest": DeployRequest, "ExtendRequest": ExtendRequest}


@router.post(
    "/agent/sandboxes",
    status_code=201,
    responses=errors(400, 402, 404, 409, 429, 502, 503),
    openapi_extra={"parameters": [PAYMENT_SIGNATURE_HEADER]},
)
async def rent_sandbox(request: Request, response: Response, services: ServicesDep) -> dict[str, Any]:
    body = await request.body()
    answer, headers = await agent_sandboxes.rent(
        services, body, request.headers.get("content-type"), request.headers
    )
    response.headers.update(headers)  # PAYMENT-RESPONSE
    return answer


@router.get(
    "/agent/sandboxes", responses=errors(401, 429, 502), openapi_extra={"parameters": MANAGER_HEADERS}
)
async def list_sandboxes(services: ServicesDep, caller: ManagerDep) -> dict[str, Any]:
    return await agent_sandboxes.list_sandboxes(services, caller)


@router.post(
    "/agent/sandboxes/{sandboxId}/pause",
    responses=errors(401, 403, 404, 409, 429, 502),
    openapi_extra={"parameters": MANAGER_HEADERS},
)
async def pause_sandbox(sandboxId: str, services: ServicesDep, caller: ManagerDep) -> dict[str, Any]:
    return await agent_sandboxes.pause(services, caller, sandboxId)


@router.post(
    "/agent/sandboxes/{sandboxId}/resume",
    responses=errors(401, 403, 404, 409, 429, 502),
    openapi_extra={"parameters": MANAGER_HEADERS},
)
async def resume_sandbox(sandboxId: str, services: ServicesDep, caller: ManagerDep) -> dict[str, Any]:
    return await agent_sandboxes.resume(services, caller, sandboxId)


@router.delete(
    "/agent/sandboxes/{sandboxId}",
    responses=errors(401, 403, 404, 429, 502),
    openapi_extra={"parameters": MANAGER_HEADERS},
)
async def delete_sandbox(sandboxId: str, services: ServicesDep, caller: ManagerDep) -> dict[str, Any]:
    return await agent_sandboxes.delete(services, caller, sandboxId)
