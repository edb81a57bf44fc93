"""What one activation patch covers: a site of :data:`~bertology.models.sites.SITES` and a granularity, one
record per granularity (:data:`GRIDS`) read by the patching code, its report and the web app.

A granularity's ``axes`` are the axes of its grid of patches, in order: ``layer`` (every layer), ``head``
(each head of a per-head site: ``q``, ``k``, ``v``, ``z``; ``k`` and ``v`` have the model's key/value heads)
and ``position`` (each position of the texts). A patch covers the whole site along the axes its
granularity does not have: ``layer`` is the whole site at every position, ``head`` one head at every
position. A site without layers (``embed``, ``final``, ``logits``) has one row on the ``layer`` axis, layer
0. A new granularity is one row of :data:`GRIDS`; a new site, one name in :data:`PATCH_SITES`. An
encoder-decoder's sites name their stack (:data:`~bertology.models.sites.STACK_SITES`: ``encoder:z``,
``decoder:resid_pre``, ``cross:q``, ...), each of them but ``pattern``.
"""

from __future__ import annotations

from dataclasses import dataclass

from bertology.errors import BertologyError
from bertology.models.sites import STACK_SITES
from bertology.options import PATCH_GRANULARITIES

#: The sites a patch can replace: those of :data:`~bertology.models.sites.SITES` but ``pattern``
#: (recorded, not replaced).
PATCH_SITES: tuple[str, ...] = (
    "embed",
    "resid_pre",
    "q",
    "k",
    "v",
    "z",
    "attn_out",
    "resid_mid",
    "mlp_out",
    "resid_post",
    "final",
    "logits",
)
#: The sites with one slice per head.
HEAD_SITES: tuple[str, ...] = ("q", "k", "v", "z")


@dataclass(frozen=True)
class PatchGrid:
    """One granularity: its name and the axes of its grid of patches (module docstring)."""

    granularity: str
    axes: tuple[str, ...]
    meaning: str

    @property
    def per_head(self) -> bool:
        return "head" in self.axes

    @property
    def per_position(self) -> bool:
        return "position" in self.axes


#: Every granularity, by name, in :data:`~bertology.options.PATCH_GRANULARITIES`'s order.
GRIDS: dict[str, PatchGrid] = {
    grid.granularity: grid
    for grid in (
        PatchGrid("head", ("layer", "head"), "each head at every position"),
        PatchGrid("head-position", ("layer", "head", "position"), "each head at each position"),
        PatchGrid("layer", ("layer",), "the whole site of each layer at every position"),
        PatchGrid("position", ("layer", "position"), "the whole site of each layer at each position"),
    )
}
assert tuple(GRIDS) == PATCH_GRANULARITIES


def patch_grid(site: str, granularity: str) -> PatchGrid:
    """The record of ``granularity`` once it is known to fit ``site``.

    Raises:
        BertologyError: an unknown site or granularity, ``pattern``, or a per-head granularity of a site
            without heads.
    """
    stack, colon, base = site.rpartition(":")
    if base == "pattern":
        raise BertologyError(
            f"The {site!r} site can be recorded but not patched; patch '{stack}{colon}z' (each head's "
            "output) instead."
        )
    if colon and base not in STACK_SITES.get(stack, ()):
        named = [
            f"{stack}:{name}" for stack, names in STACK_SITES.items() for name in names if name != "pattern"
        ]
        raise BertologyError(
            f"There is no site {site!r} to patch; an encoder-decoder's sites are {', '.join(named)}."
        )
    if not colon and site not in PATCH_SITES:
        raise BertologyError(f"There is no site {site!r} to patch; the sites are {', '.join(PATCH_SITES)}.")
    grid = GRIDS.get(granularity)
    if grid is None:
        raise BertologyError(
            f"Unknown patching granularity {granularity!r}; choose one of {', '.join(GRIDS)}."
        )
    if grid.per_head and base not in HEAD_SITES:
        raise BertologyError(
            f"The site {site!r} has no head axis, so it cannot be patched by {granularity!r}; choose layer "
            f"or position, or a per-head site ({', '.join(HEAD_SITES)})."
        )
    return grid
