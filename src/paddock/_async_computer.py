"""``AsyncComputer``: computer use on a ``desktop:1`` sandbox (§12.3), as ``sandbox.computer``.

    png = await sandbox.computer.screenshot()                 # raw PNG bytes of screen-0
    await sandbox.computer.launch("chromium", "https://example.com")
    await sandbox.computer.click(640, 400)
    await sandbox.computer.type("hello")
    await sandbox.computer.press("ctrl", "s")
    view = await sandbox.computer.connect()                   # view.url: a live noVNC view, short-lived

Every method takes ``screen_id`` (``screen-0`` … ``screen-7``; default ``screen-0``). A sandbox not
booted from a desktop image raises ``ConflictError`` (409 ``INVALID_STATE``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from paddock import _base
from paddock._models import LiveView, Screen, Window, WindowGeometry

if TYPE_CHECKING:
    from paddock._async_sandbox import AsyncSandbox

Button = Literal["left", "middle", "right"]


class AsyncComputer:
    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox

    def _path(self, *rest: str) -> str:
        return self._sandbox._path("computer", *rest)

    async def _call(
        self, method: str, path: str, screen_id: str | None, body: dict[str, Any] | None = None, **params: Any
    ) -> Any:
        query = _base.drop_none({"screen_id": screen_id, **params})
        kwargs: dict[str, Any] = {"params": query} if query else {}
        if body is not None:
            kwargs["json"] = body
        return await self._sandbox._client.request(method, self._path(*path.split("/")), **kwargs)

    # -- looking ---------------------------------------------------------------------------------

    async def screenshot(
        self,
        *,
        screen_id: str | None = None,
        window_id: str | None = None,
        region: tuple[int, int, int, int] | None = None,
    ) -> bytes:
        """A PNG of the screen, of one window, or of ``region`` = (x, y, width, height)."""
        params: dict[str, Any] = {"screen_id": screen_id, "window_id": window_id}
        if region is not None:
            params.update(zip(("x", "y", "width", "height"), region, strict=True))
        resp = await self._sandbox._client.open_stream(
            "GET", self._path("screenshot"), params=_base.drop_none(params)
        )
        try:
            return bytes(await resp.aread())
        finally:
            await resp.aclose()

    async def screen_size(self, *, screen_id: str | None = None) -> tuple[int, int]:
        data = await self._call("GET", "screen", screen_id)
        return int(data["width"]), int(data["height"])

    async def cursor(self, *, screen_id: str | None = None) -> tuple[int, int]:
        data = await self._call("GET", "cursor", screen_id)
        return int(data["x"]), int(data["y"])

    # -- clipboard, apps -------------------------------------------------------------------------

    async def get_clipboard(self, *, screen_id: str | None = None) -> str:
        return str((await self._call("GET", "clipboard", screen_id))["text"])

    async def set_clipboard(self, text: str, *, screen_id: str | None = None) -> None:
        await self._call("PUT", "clipboard", screen_id, {"text": text})

    async def open(self, target: str, *, screen_id: str | None = None) -> None:
        """Opens a URL in Chromium, or a file with its application (text in Mousepad)."""
        await self._call("POST", "open", screen_id, {"target": target})

    async def launch(self, application: str, uri: str | None = None, *, screen_id: str | None = None) -> None:
        """Starts ``chromium``, ``mousepad`` or another installed program, optionally on ``uri``."""
        await self._call(
            "POST", "launch", screen_id, _base.drop_none({"application": application, "uri": uri})
        )

    # -- mouse -----------------------------------------------------------------------------------

    async def move_mouse(self, x: int, y: int, *, screen_id: str | None = None) -> None:
        await self._call("POST", "mouse/move", screen_id, {"x": x, "y": y})

    async def click(
        self,
        x: int | None = None,
        y: int | None = None,
        *,
        button: Button = "left",
        count: int = 1,
        screen_id: str | None = None,
    ) -> None:
        """Clicks ``count`` times at (x, y), or where the pointer is."""
        body = _base.drop_none({"x": x, "y": y, "button": button, "count": count})
        await self._call("POST", "mouse/click", screen_id, body)

    async def double_click(
        self, x: int | None = None, y: int | None = None, *, screen_id: str | None = None
    ) -> None:
        await self.click(x, y, count=2, screen_id=screen_id)

    async def scroll(
        self, direction: Literal["up", "down"] = "down", amount: int = 1, *, screen_id: str | None = None
    ) -> None:
        await self._call("POST", "mouse/scroll", screen_id, {"direction": direction, "amount": amount})

    async def drag(
        self, start: tuple[int, int], end: tuple[int, int], *, screen_id: str | None = None
    ) -> None:
        body = {"from": {"x": start[0], "y": start[1]}, "to": {"x": end[0], "y": end[1]}}
        await self._call("POST", "mouse/drag", screen_id, body)

    async def mouse_down(self, button: Button = "left", *, screen_id: str | None = None) -> None:
        await self._call("POST", "mouse/down", screen_id, {"button": button})

    async def mouse_up(self, button: Button = "left", *, screen_id: str | None = None) -> None:
        await self._call("POST", "mouse/up", screen_id, {"button": button})

    # -- keyboard --------------------------------------------------------------------------------

    async def type(self, text: str, *, delay_in_ms: int | None = None, screen_id: str | None = None) -> None:
        """Types ``text`` into the focused window."""
        await self._call(
            "POST", "keyboard/type", screen_id, _base.drop_none({"text": text, "delay_in_ms": delay_in_ms})
        )

    async def press(self, *keys: str, screen_id: str | None = None) -> None:
        """Presses ``keys`` together and releases them: ``press("ctrl", "s")``, ``press("enter")``."""
        await self._call("POST", "keyboard/press", screen_id, {"keys": list(keys)})

    async def key_down(self, *keys: str, screen_id: str | None = None) -> None:
        await self._call("POST", "keyboard/down", screen_id, {"keys": list(keys)})

    async def key_up(self, *keys: str, screen_id: str | None = None) -> None:
        await self._call("POST", "keyboard/up", screen_id, {"keys": list(keys)})

    # -- windows ---------------------------------------------------------------------------------

    async def windows(self, application: str | None = None, *, screen_id: str | None = None) -> list[Window]:
        """The screen's top-level windows (minimized ones too); ``application`` filters by class."""
        data = await self._call("GET", "windows", screen_id, application=application)
        return [Window.from_api(item) for item in data]

    async def current_window(self, *, screen_id: str | None = None) -> Window:
        return Window.from_api(await self._call("GET", "windows/current", screen_id))

    async def window(self, window_id: str, *, screen_id: str | None = None) -> Window:
        return Window.from_api(await self._call("GET", f"windows/{window_id}", screen_id))

    async def window_geometry(self, window_id: str, *, screen_id: str | None = None) -> WindowGeometry:
        return WindowGeometry.from_api(await self._call("GET", f"windows/{window_id}/geometry", screen_id))

    async def focus_window(self, window_id: str, *, screen_id: str | None = None) -> None:
        await self._call("POST", f"windows/{window_id}/focus", screen_id)

    async def maximize_window(self, window_id: str, *, screen_id: str | None = None) -> None:
        await self._call("POST", f"windows/{window_id}/maximize", screen_id)

    async def minimize_window(self, window_id: str, *, screen_id: str | None = None) -> None:
        await self._call("POST", f"windows/{window_id}/minimize", screen_id)

    async def restore_window(self, window_id: str, *, screen_id: str | None = None) -> None:
        await self._call("POST", f"windows/{window_id}/restore", screen_id)

    async def move_window(self, window_id: str, x: int, y: int, *, screen_id: str | None = None) -> None:
        await self._call("POST", f"windows/{window_id}/move", screen_id, {"x": x, "y": y})

    async def resize_window(
        self, window_id: str, width: int, height: int, *, screen_id: str | None = None
    ) -> None:
        await self._call("POST", f"windows/{window_id}/resize", screen_id, {"width": width, "height": height})

    async def close_window(self, window_id: str, *, screen_id: str | None = None) -> None:
        await self._call("DELETE", f"windows/{window_id}", screen_id)

    # -- screens ---------------------------------------------------------------------------------

    async def screens(self) -> list[Screen]:
        return [Screen.from_api(item) for item in await self._call("GET", "screens", None)]

    async def create_screen(self, width: int | None = None, height: int | None = None) -> Screen:
        """A new independent screen (up to 8 per sandbox), ``screen-1`` … ``screen-7``."""
        body = _base.drop_none({"width": width, "height": height})
        return Screen.from_api(await self._call("POST", "screens", None, body))

    async def get_screen(self, screen_id: str) -> Screen:
        return Screen.from_api(await self._call("GET", f"screens/{screen_id}", None))

    async def resize_screen(
        self, screen_id: str, width: int | None = None, height: int | None = None
    ) -> Screen:
        """Restarts the screen's X server at the new size: the windows on it are closed."""
        body = _base.drop_none({"width": width, "height": height})
        return Screen.from_api(await self._call("POST", f"screens/{screen_id}/resize", None, body))

    async def delete_screen(self, screen_id: str) -> None:
        await self._call("DELETE", f"screens/{screen_id}", None)

    async def connect(self, screen_id: str = "screen-0") -> LiveView:
        """A short-lived link to watch and drive the screen in a browser (noVNC through the ingress
        proxy); a page opened before it expires stays connected."""
        return LiveView.from_api(await self._call("GET", f"screens/{screen_id}/connect", None))
