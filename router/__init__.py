"""``kvlink-rag router``: an ASGI proxy in front of N replicas that sends each query to the replica already
holding its documents (cache events over Redis, :mod:`service.cache_publisher`). A front end: it may import
``service`` and ``store``; only ``cli`` and ``bench`` (the routing simulation,
:mod:`bench.routing_sim`) import it."""
