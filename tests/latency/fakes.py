"""The latency tests' space and fake timer: a tiny space of 5 layers (4 block signatures), the
fake timer counting what it prepares, a fast protocol."""

from __future__ import annotations

from conftest import latency_space

from fbnas.backends.fake import FakeTimer
from fbnas.latency import Protocol
from fbnas.search_space import SearchSpace

FAST = Protocol(rounds=4, extra_rounds=2)

TINY = latency_space()


def tiny_space(**over) -> SearchSpace:
    return SearchSpace.from_dict({**TINY, **over})


class CountingFake(FakeTimer):
    """A fake timer that counts how often each signature was prepared (built)."""

    def __init__(self, *a, interrupt_at: int | None = None, **kw):
        super().__init__(*a, **kw)
        self.prepared: list[str] = []
        self.interrupt_at = interrupt_at

    def prepare(self, module, input_chw, label=""):
        self.prepared.append(label)
        if len(self.prepared) == self.interrupt_at:
            raise KeyboardInterrupt  # as if Ctrl-C came while building
        return super().prepare(module, input_chw, label)


def fake(**kw) -> CountingFake:
    return CountingFake(**{"threads": 1, "batch": 1, "dtype": "float32", **kw})
