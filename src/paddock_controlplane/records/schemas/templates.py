"""The template build body (§11.13)."""

from __future__ import annotations

from pydantic import StrictBool, StrictStr

from paddock_controlplane.records.schemas.base import Body


class TemplateCreateRequest(Body):
    name: StrictStr | None = None
    dockerfile: StrictStr | None = None
    base: StrictStr | None = None
    #: Extension: standard base64 of a tar (optionally gzip) archive, the files COPY/ADD read.
    context: StrictStr | None = None
    #: Extension: build a template of this name again (see the module's docstring).
    rebuild: StrictBool | None = None
