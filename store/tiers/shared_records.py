"""What a shared tier's meta says about a local copy, and the payloads kept for the local fill (helpers of
:mod:`store.tiers.shared`)."""

from __future__ import annotations

from collections.abc import Iterator


def same(a: dict | None, b: dict | None) -> bool:
    """Whether two meta records describe the same bytes."""
    return (a is not None and b is not None and a.get("checksum") == b.get("checksum")
            and a.get("format_version") == b.get("format_version") and a.get("shape") == b.get("shape"))


def kept(it: Iterator[bytes], into: list[bytes]) -> Iterator[bytes]:
    """The payloads of ``it``, each also appended to ``into`` (for the local fill)."""
    for buf in it:
        into.append(buf)
        yield buf


def local_meta(meta: dict) -> dict:
    """``meta`` without the shared backend's own layout fields."""
    return {k: v for k, v in meta.items() if k != "redis"}
