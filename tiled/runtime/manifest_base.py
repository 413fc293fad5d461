"""What every part of the manifest schema checks with: ManifestError and the checks of single
values (an int, an identifier, a dtype). Its own module because the expression
(tiled.runtime.manifest_exprs) and argument (tiled.runtime.manifest_args) modules raise the same
error by the same rules as tiled.runtime.manifest, which imports them, so they cannot take these
from there without an import cycle.
"""

from __future__ import annotations

import re

from tiled.errors import LaunchError
from tiled.ir import dtypes

DTYPES = tuple(dtypes.NAME_TO_ENUM)

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ManifestError(LaunchError):
    """A manifest that does not follow the schema; the message names the field."""


def _fail(where: str, problem: str) -> ManifestError:
    return ManifestError(f"manifest {where}: {problem}")


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _ident(v: object, where: str) -> str:
    if not isinstance(v, str) or not _IDENT.fullmatch(v):
        raise _fail(where, f"expected an identifier, got {v!r}")
    return v


def _dtype(v: object, where: str) -> str:
    if v not in DTYPES:
        raise _fail(where, f"unknown dtype {v!r}; known: {', '.join(DTYPES)}")
    return v  # type: ignore[return-value]
