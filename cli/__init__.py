"""The ``kvlink-rag`` command line: the top layer. It drives the service layer (:mod:`service`), the core
(:mod:`kvlink_rag`), the store, training, bench and the API server; nothing imports it.
Entry point: :data:`cli.main.app`."""
