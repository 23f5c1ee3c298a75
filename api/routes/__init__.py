"""Routes, one module per resource: documents, query, openai (chat completions), health (and metrics),
playground (the web page at /)."""
