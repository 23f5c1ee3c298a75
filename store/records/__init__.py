"""The byte layout of one stored document: meta record, checksums, importance-ordered layers, int8."""
