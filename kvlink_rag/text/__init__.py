"""Text and tokens before the model: the chat-template framing and plain-text user tokens (:mod:`.prompt`),
multi-turn conversations (:mod:`.conversation`) and long documents as chunks (:mod:`.chunking`)."""
