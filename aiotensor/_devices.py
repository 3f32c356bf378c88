"""Device names and placement: which device an op runs on, and soft placement."""

from __future__ import annotations

import re

from ._errors import InvalidDeviceError

__all__ = ["CPU0", "canonical_device"]

#: The device every backend has; soft placement falls back to it.
CPU0 = "/cpu:0"

_DEVICE_RE = re.compile(r"^/?(?:device:)?(?P<kind>[a-z][a-z_]*)(?::(?P<index>\d+))?$", re.IGNORECASE)


def canonical_device(name: object) -> str:
    """Normalize a device name: ``"CPU"``, ``"cpu:0"`` and ``"/device:CPU:0"`` all give ``"/cpu:0"``.

    Raises:
        InvalidDeviceError: ``name`` is not a string of that form.
    """
    if not isinstance(name, str):
        raise InvalidDeviceError(f"device name must be a str like '/cpu:0', got {name!r}")
    match = _DEVICE_RE.match(name.strip())
    if match is None:
        raise InvalidDeviceError(f"malformed device name {name!r}; expected a name like '/cpu:0'")
    return f"/{match['kind'].lower()}:{int(match['index'] or 0)}"
