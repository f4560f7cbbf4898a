"""Candidate blocks: a registry of op name -> factory(c_in, c_out, stride, **kw).

Importing this package registers the built-in blocks. To add a block type, write one module
with a factory and decorate it with `@register_block("name")` (or `register_family` for a
parsed family), then import it here.
"""

from fbnas.blocks import irf, simple  # noqa: F401  (registration)
from fbnas.blocks.common import ConvBN, init_weights, make_divisible
from fbnas.blocks.registry import (
    aliases,
    build_block,
    canonical_op,
    register_alias,
    register_block,
    register_family,
    registered_ops,
)

__all__ = [
    "ConvBN", "aliases", "build_block", "canonical_op", "init_weights", "make_divisible",
    "register_alias", "register_block", "register_family", "registered_ops",
]
