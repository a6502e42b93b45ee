"""What the request bodies share: the base model (unknown fields ignored) and the integer bounds.

Integers carry bounds (in the OpenAPI document too): far beyond any legitimate value, but inside what
the databases store, so 2^63 is a 400 naming the field and never an overflow in SQL.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictInt

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
# One recharge adds at most 1 PiB, and a budget never exceeds 1 EiB: sums stay far below 2^63.
MAX_RECHARGE_BYTES = 1 << 50
MAX_BANDWIDTH_QUOTA_BYTES = 1 << 60

Int32 = Annotated[StrictInt, Field(ge=-INT32_MAX, le=INT32_MAX)]
Int64 = Annotated[StrictInt, Field(ge=-INT64_MAX, le=INT64_MAX)]


class Body(BaseModel):
    model_config = ConfigDict(extra="ignore")
