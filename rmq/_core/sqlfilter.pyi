"""Type stubs for rmq._core.sqlfilter (the broker's native SQL92 evaluator)."""
from typing import Optional

from typing_extensions import Buffer

MAX_PROPERTIES: int

class SqlFilter:
    expression: str
    def __init__(self, expression: str, nodes: list, root: int, names: list[bytes]) -> None: ...
    def matches(self, props: Buffer) -> bool: ...
    def evaluate(self, props: Buffer) -> Optional[bool]: ...
