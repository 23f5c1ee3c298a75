"""Text normalisation that keeps tokens: what is tokenised, hashed into cache keys and stored (kernel: the
store imports it to key texts without reaching into the prompt code)."""

from __future__ import annotations

import unicodedata


def normalize_text(text: str) -> str:
    """NFC-normalise, turn CRLF/CR into LF, strip the ends.

    Only changes that keep the meaning: the normalised text is exactly what is tokenised and what the
    content hash covers, so equal hashes mean equal token ids. Whitespace inside the text is kept: it
    changes the token ids, so two texts that differ in it must not share a cache.
    """
    return unicodedata.normalize("NFC", text).replace("\r\n", "\n").replace("\r", "\n").strip()
