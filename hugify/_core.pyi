from os import PathLike
from typing import Any

VERSION: str
DEFAULT_HUGE_PAGE: int
DEFAULT_THRESHOLD: int

class HugifyError(Exception):
    reason: str
    kind: str
    detail: str

def inspect(path: str | PathLike[str], huge_page: int, threshold: int, mode: str = "auto") -> dict[str, Any]: ...
def transform(
    src: str | PathLike[str], tmp: str | PathLike[str], huge_page: int, threshold: int, mode: str = "auto"
) -> dict[str, Any]: ...
def transform_bytes(
    data: bytes, huge_page: int, threshold: int, mode: str = "auto"
) -> tuple[dict[str, Any], bytes]: ...
def reasons() -> list[tuple[str, str, str]]: ...
