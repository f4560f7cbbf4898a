"""Block registry: op name -> factory(c_in, c_out, stride, **kw) -> nn.Module.

Two kinds of entry:
- exact names (`skip`, `basic_block`, ...), registered with `@register_block("name")`;
- families, registered with `register_family(prefix, parse)`: a parser turns a name such as
  `ir_k5_e6_se` into (canonical name, factory). Names are parsed, never enumerated.

`canonical_op(name)` maps every accepted spelling to one canonical form, so architectures,
latency tables and hashes agree however the user spelled an op.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from torch import nn

from fbnas.errors import FbnasError
from fbnas.io import show
from fbnas.registry import Registry


class BlockFactory(Protocol):
    def __call__(self, c_in: int, c_out: int, stride: int, **kw) -> nn.Module: ...


# A family parser returns (canonical_name, factory), or raises FbnasError naming the op.
FamilyParser = Callable[[str], tuple[str, BlockFactory]]

# exact op names -> factory; other spellings -> the name they stand for (which may be a
# family member); family prefixes -> parser (attribute `examples`: canonical members)
BLOCKS: Registry[BlockFactory] = Registry("op")
ALIASES: Registry[str] = Registry("op alias")
FAMILIES: Registry[FamilyParser] = Registry("block family")


def _taken(name: str) -> bool:
    return name in BLOCKS or name in ALIASES


def register_block(name: str, *aliases: str) -> Callable[[BlockFactory], BlockFactory]:
    """Decorator: register `factory` under an exact op name (and aliases); duplicates raise."""

    def deco(factory: BlockFactory) -> BlockFactory:
        for n in (name, *aliases):
            if _taken(n):
                raise ValueError(f"block name '{n}' is already registered")
        BLOCKS.register(name, factory)
        for a in aliases:
            ALIASES.register(a, name)
        return factory

    return deco


def register_alias(alias: str, target: str) -> None:
    """Register `alias` as another spelling of op `target` (which may be a family member)."""
    if _taken(alias):
        raise ValueError(f"block name '{alias}' is already registered")
    ALIASES.register(alias, target)


def register_family(prefix: str, parse: FamilyParser, examples: list[str]) -> None:
    """Register a parsed family: every name `prefix_...` goes to `parse`.

    `examples` are canonical members that tests and docs iterate over.
    """
    FAMILIES.register(prefix, parse, examples=list(examples))


MAX_NAME = 100


def _resolve(name: str) -> tuple[str, BlockFactory]:
    if not isinstance(name, str) or not name:
        raise FbnasError(f"op name must be a non-empty string, got {show(name)}")
    if len(name) > MAX_NAME or not name.isprintable():
        raise FbnasError(f"unknown op {show(name)} (op names are short printable words such "
                         "as ir_k3_e6 or skip)")
    if name in ALIASES:
        name = ALIASES.get(name)
    if name in BLOCKS:
        return name, BLOCKS.get(name)
    prefix = name.split("_", 1)[0]
    if prefix in FAMILIES:
        return FAMILIES.get(prefix)(name)
    # The paper writes candidates without the ir_ prefix (k3_e1, k5_e1_g2).
    if name.startswith("k") and "ir" in FAMILIES:
        return FAMILIES.get("ir")("ir_" + name)
    known = ", ".join(sorted(BLOCKS)) + ", " + ", ".join(f"{p}_..." for p in sorted(FAMILIES))
    raise FbnasError(f"unknown op '{name}' (known: {known})")


def canonical_op(name: str) -> str:
    """The one canonical spelling of an op name; raises FbnasError for an unknown op."""
    return _resolve(name)[0]


def op_spec(name: str) -> object | None:
    """What op `name`'s factory declares it builds (a family's parsed spec, e.g. the
    `IRFSpec` of `ir_k3_e6`, however the op was spelled), None for an op that declares none;
    raises FbnasError for an unknown op. Code that must know an op's structure (which
    candidates can share a superkernel) asks this, not the name."""
    return getattr(_resolve(name)[1], "spec", None)


def build_block(name: str, c_in: int, c_out: int, stride: int, **kw) -> nn.Module:
    """Build candidate block `name` for the given shape."""
    for what, v in (("c_in", c_in), ("c_out", c_out), ("stride", stride)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise FbnasError(f"op '{name}': {what} must be a positive integer, got {v!r}")
    _, factory = _resolve(name)
    return factory(c_in, c_out, stride, **kw)


def registered_ops() -> list[str]:
    """Exact names plus each family's examples (tests loop over this)."""
    return sorted(BLOCKS) + [n for p in FAMILIES for n in FAMILIES.attr(p, "examples")]


def aliases() -> dict[str, str]:
    return dict(ALIASES.items())
