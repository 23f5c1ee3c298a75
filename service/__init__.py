"""Service layer: query answering, queues, retrieval and runtime wiring shared by the API and the workers."""
