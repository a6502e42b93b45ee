"""What each catalog root image holds: one source for the image builder and for ``GET /v1/rootfs``.

The host agent's builder (``paddock_hostagent.images``) installs exactly the packages listed here, and
the control plane's catalog describes each image with the labels of the same contents, so the
description cannot promise what the build does not install (``devbox:1`` once advertised a container
engine and SSH it never had). Each entry also names a shell probe that succeeds inside the built image
only when that content is there; the image tests run them in real sandboxes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Content:
    """One thing an image holds: how the description names it, the Debian packages that provide it and
    a ``sh -c`` probe that exits 0 inside the image when it is there."""

    label: str
    packages: tuple[str, ...]
    probe: str
    #: Symbolic links the builder makes once the packages are in: (path in the image, what it points to).
    links: tuple[tuple[str, str], ...] = ()
    #: Files the builder writes once the packages are in: (path in the image, text, mode).
    files: tuple[tuple[str, str, int], ...] = ()


@dataclass(frozen=True)
class RootImage:
    name: str
    summary: str
    contents: tuple[Content, ...] = ()
    note: str = ""  # what the image deliberately lacks, or where it comes from: a sentence after the contents

    @property
    def packages(self) -> tuple[str, ...]:
        """The packages the builder installs, in order, each once."""
        return tuple(dict.fromkeys(pkg for content in self.contents for pkg in content.packages))

    @property
    def links(self) -> tuple[tuple[str, str], ...]:
        """The symbolic links the builder makes after the packages, in order."""
        return tuple(link for content in self.contents for link in content.links)

    @property
    def files(self) -> tuple[tuple[str, str, int], ...]:
        """The files the builder writes after the packages, in order."""
        return tuple(file for content in self.contents for file in content.files)

    @property
    def description(self) -> str:
        text = self.summary
        if self.contents:
            text += ": " + "; ".join(content.label for content in self.contents)
        return f"{text}. {self.note}" if self.note else text


BASE_TOOLS = Content(
    "bash, coreutils, procps, iproute2, curl, ping and CA certificates",
    ("bash", "coreutils", "procps", "iproute2", "curl", "ca-certificates", "iputils-ping"),
    "bash --version && ps --version && ip -V && curl --version && ping -V"
    " && test -s /etc/ssl/certs/ca-certificates.crt",
)

DEVBOX_CONTENTS = (
    BASE_TOOLS,
    # Debian marks its Python externally managed (PEP 668), so a bare ``pip install`` as root refuses.
    # A sandbox is disposable, and E2B's base image and Docker's python images install system-wide, so
    # pip does here too (into /usr/local, beside Debian's own packages, not over them).
    Content(
        "Python 3 with pip (system-wide installs allowed) and venv",
        ("python3", "python3-pip", "python3-venv"),
        "python3 --version && pip3 --version && python3 -c 'import ensurepip, venv'"
        ' && test "$(pip3 config --global get global.break-system-packages)" = true',
        files=(
            (
                "etc/pip.conf",
                "# Paddock: a sandbox is disposable, so pip installs system-wide (into /usr/local), as E2B's base does.\n"
                "[global]\nbreak-system-packages = true\n",
                0o644,
            ),
        ),
    ),
    Content(
        "numpy, pandas and requests for Python",
        ("python3-numpy", "python3-pandas", "python3-requests"),
        "python3 -c 'import numpy, pandas, requests'",
    ),
    Content("Node.js with npm", ("nodejs", "npm"), "node --version && npm --version"),
    Content("git", ("git",), "git --version"),
    Content("gcc, g++ and make", ("build-essential",), "gcc --version && g++ --version && make --version"),
    Content("SQLite", ("sqlite3",), "sqlite3 --version"),
    Content("an SSH client", ("openssh-client",), "ssh -V"),
    Content(
        "jq, less, nano, unzip and wget",
        ("jq", "less", "nano", "unzip", "wget"),
        "jq --version && less --version && nano --version && unzip -v && wget --version",
    ),
)

DESKTOP_CONTENTS = (
    BASE_TOOLS,
    Content(
        "an Xvfb display per screen with the Openbox window manager",
        ("xvfb", "openbox", "x11-utils", "fonts-dejavu-core"),
        "command -v Xvfb && command -v openbox && command -v xwininfo",
    ),
    Content(
        "x11vnc and noVNC (websockify) for the live view",
        ("x11vnc", "novnc", "python3-websockify"),
        "command -v x11vnc && test -f /usr/share/novnc/vnc.html && python3 -c 'import websockify'",
    ),
    Content("Chromium", ("chromium",), "chromium --version"),
    Content("the Mousepad text editor", ("mousepad",), "command -v mousepad"),
    Content(
        "xdotool, wmctrl and xclip for computer use",
        ("xdotool", "wmctrl", "xclip"),
        "command -v xdotool && command -v wmctrl && command -v xclip",
    ),
    Content(
        "Python 3 with Pillow for screenshots",
        ("python3", "python3-pil"),
        "python3 -c 'import PIL.ImageGrab'",
    ),
    # What the e2b-desktop SDK runs in the sandbox (docs/e2b.md): startxfce4 until xfce4-session, xfwm4 and
    # xfdesktop are up (dbus-launch gives the session its bus), scrot for screenshots, xrandr for the size.
    # librsvg2-common is the SVG loader xfdesktop needs to paint its backdrop (xfce-x.svg; black without).
    Content(
        "XFCE (session, xfwm4 and xfdesktop), scrot and xrandr for the e2b-desktop SDK",
        ("xfce4-session", "xfwm4", "xfdesktop4", "librsvg2-common", "dbus-x11", "scrot", "x11-xserver-utils"),
        "command -v startxfce4 && command -v xfwm4 && command -v xfdesktop && command -v dbus-launch"
        " && command -v scrot && command -v xrandr",
    ),
    # The SDK's stream runs `cd /opt/noVNC/utils && ./novnc_proxy --web /opt/noVNC` (E2B's template
    # clones noVNC there; Debian's novnc is /usr/share/novnc, with the same novnc_proxy, which finds
    # websockify on PATH) and waits for its port with netstat; its launch runs gtk-launch; its open runs
    # xdg-open, which needs `file` to know a file's type and hands URLs and HTML to Chromium, which
    # refuses to run as root (the image's user) without --no-sandbox: the sandbox is the isolation, as
    # for Paddock's own computer use. In the XFCE session xdg-open hands everything to exo-open, which
    # fails there (exit 4; the sandbox's commands have no session bus); the wrapper first on PATH
    # makes it take its generic path (by file type and URL scheme) unless the caller names a desktop.
    Content(
        "noVNC at /opt/noVNC, netstat, gtk-launch and xdg-open's helpers for the e2b-desktop SDK's stream,"
        " launch and open",
        ("net-tools", "libgtk-3-bin", "file"),
        "test -x /opt/noVNC/utils/novnc_proxy && test -f /opt/noVNC/vnc.html && command -v netstat"
        " && command -v gtk-launch && command -v file && grep -q -- --no-sandbox /etc/chromium.d/paddock"
        " && test -x /usr/local/bin/xdg-open",
        links=(("opt/noVNC", "/usr/share/novnc"),),
        files=(
            (
                "etc/chromium.d/paddock",
                "# Chromium runs as root in a Paddock sandbox, which is its isolation (docs/desktop.md).\n"
                'export CHROMIUM_FLAGS="$CHROMIUM_FLAGS --no-sandbox"\n',
                0o644,
            ),
            (
                "usr/local/bin/xdg-open",
                "#!/bin/sh\n# Paddock: xdg-open's generic path (exo-open fails in a sandbox's commands).\n"
                'XDG_CURRENT_DESKTOP="${XDG_CURRENT_DESKTOP:-X-Generic}" exec /usr/bin/xdg-open "$@"\n',
                0o755,
            ),
        ),
    ),
)

# What ``sandbox.run_code`` needs: a Jupyter kernel (ipykernel) and jupyter_client to drive it, with the
# usual data and plotting libraries, all from Debian packages (sandboxes cannot reach PyPI).
CODE_INTERPRETER_CONTENTS = (
    BASE_TOOLS,
    Content(
        "Python 3 with an IPython kernel (ipykernel) and jupyter_client",
        ("python3", "python3-ipykernel", "python3-jupyter-client"),
        "python3 -c 'import ipykernel, jupyter_client'",
    ),
    Content(
        "matplotlib, numpy and pandas for Python",
        ("python3-matplotlib", "python3-numpy", "python3-pandas"),
        "python3 -c 'import matplotlib, numpy, pandas'",
    ),
)

ROOT_IMAGES: tuple[RootImage, ...] = (
    RootImage(
        "devbox:1",
        "Debian 13 development image",
        DEVBOX_CONTENTS,
        "No container engine and no SSH server",
    ),
    RootImage("desktop:1", "Debian 13 graphical desktop", DESKTOP_CONTENTS),
    RootImage(
        "code-interpreter:1",
        "Debian 13 code interpreter for sandbox.run_code",
        CODE_INTERPRETER_CONTENTS,
        "Kernels start on the first run_code of each context",
    ),
    RootImage("ubuntu:26.04", "Minimal Ubuntu 26.04", (BASE_TOOLS,)),
    RootImage("debian:13", "Minimal Debian 13", (BASE_TOOLS,)),
    RootImage(
        "alpine:3.20",
        "Minimal Alpine Linux 3.20",
        note="Unpacked from the root filesystem tarball the operator configures; the catalog default",
    ),
)
ROOT_IMAGES_BY_NAME = {image.name: image for image in ROOT_IMAGES}
