"""The queue between a background layer reader and its consumer (:mod:`store.tiers.prefetch`,
:mod:`store.tiers.retained_reader`)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

import torch


class Reader:
    """The queue between a background reader and the consumer: layers handed over ``depth`` ahead, an exception
    handed over in their place, and the consumer's early close stopping the reader."""

    def __init__(self, n_layers: int, depth: int):
        self.n_layers = n_layers
        self.queue: queue.Queue = queue.Queue(maxsize=depth)
        self.stop = threading.Event()

    def _hand_over(self, item) -> bool:
        """Queue ``item`` unless the consumer has stopped; False when it has."""
        while not self.stop.is_set():
            try:
                self.queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def consume(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The consumer side: the layers in order; closing it early stops the reader."""
        try:
            for _ in range(self.n_layers):
                item = self.queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.stop.set()
