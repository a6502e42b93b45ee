"""Computer-use bodies (§12.3), checked here before the desktop helper checks them again."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from paddock_controlplane.records.schemas.base import Body

COORDINATE = Field(ge=0, le=100_000)
MAX_TEXT = 1 << 16


class Point(Body):
    x: int = COORDINATE
    y: int = COORDINATE


class ClipboardRequest(Body):
    text: str = Field(max_length=MAX_TEXT)


class OpenRequest(Body):
    target: str = Field(min_length=1, max_length=4096)


class LaunchRequest(Body):
    application: str = Field(min_length=1, max_length=256)
    uri: str | None = Field(default=None, max_length=4096)


class MouseMoveRequest(Point):
    pass


class MouseClickRequest(Body):
    button: Literal["left", "middle", "right"] = "left"
    x: int | None = Field(default=None, ge=0, le=100_000)
    y: int | None = Field(default=None, ge=0, le=100_000)
    count: int = Field(default=1, ge=1, le=10)


class MouseScrollRequest(Body):
    direction: Literal["up", "down"] = "down"
    amount: int = Field(default=1, ge=1, le=100)


class MouseDragRequest(Body):
    from_: Point = Field(alias="from")
    to: Point


class MouseButtonRequest(Body):
    button: Literal["left", "middle", "right"] = "left"


class TypeRequest(Body):
    text: str = Field(max_length=MAX_TEXT)
    delay_in_ms: int = Field(default=12, ge=0, le=1000)


class KeysRequest(Body):
    keys: list[str] = Field(min_length=1, max_length=16)


class WindowMoveRequest(Point):
    pass


class SizeRequest(Body):
    width: int = Field(ge=320, le=3840)
    height: int = Field(ge=240, le=2160)


class ScreenSizeRequest(Body):
    width: int | None = Field(default=None, ge=320, le=3840)
    height: int | None = Field(default=None, ge=240, le=2160)


class WindowSizeRequest(Body):
    width: int = Field(ge=1, le=3840)
    height: int = Field(ge=1, le=2160)
