"""``bertology cache list | clear``: the encoded-corpus cache (:mod:`bertology.corpus.cache`)."""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Annotated

import typer

from bertology.cli.app import BertologyApp, app, out
from bertology.cli.options import positive_finite

if TYPE_CHECKING:
    from bertology.corpus.cache import CacheEntry

cache_app = BertologyApp(
    help="The encoded-corpus cache: corpora read, segmented and encoded once, kept in "
    "$BERTOLOGY_CACHE/corpora "
    "(or $BERTOLOGY_CORPUS_CACHE) for later runs; at most $BERTOLOGY_CACHE_MB megabytes, least recently "
    "used removed first.",
    no_args_is_help=True,
)
app.add_typer(cache_app, name="cache")

#: Seconds in a day (``cache clear --older-than DAYS``).
DAY = 86_400.0


def entry_line(entry: CacheEntry, megabyte: int) -> str:
    """One entry as ``cache list`` shows it: key, corpus, the model whose run wrote it and the tokenizer's
    origin, ``--max-len``, format, pairs or single texts, segments, size and last use ("?" where an entry
    written before these were recorded does not say)."""
    used = datetime.datetime.fromtimestamp(entry.used).isoformat(sep=" ", timespec="seconds")
    texts = {True: "pairs", False: "single texts", None: "?"}[entry.pairs]
    return (
        f"{entry.key}  {entry.corpus}  model {entry.model or '?'} (tokenizer {entry.tokenizer or '?'})  "
        f"--max-len {entry.max_length or '?'}  {entry.format or '?'}, {texts}  {entry.segments} segments  "
        f"{entry.bytes / megabyte:.1f} MB  used {used}"
    )


@cache_app.command("list")
def list_entries() -> None:
    """List the cache's entries, least recently used first: key, corpus file, model (and where its
    tokenizer was loaded from), --max-len, format, pairs or single texts, segments, size, last use."""
    from bertology.corpus.cache import MEGABYTE, cache_entries, corpus_cache_folder, limit_bytes

    entries = cache_entries()
    total = sum(entry.bytes for entry in entries)
    for entry in entries:
        out.print(entry_line(entry, MEGABYTE), highlight=False)
    out.print(
        f"{len(entries)} entries, {total / MEGABYTE:.1f} MB of at most {limit_bytes() / MEGABYTE:.0f} MB in "
        f"{corpus_cache_folder()}.",
        highlight=False,
    )


@cache_app.command("clear")
def clear(
    keys: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="KEY",
            help="Keys of the entries to remove (as `bertology cache list` shows them, or the start of one); "
            "default: every entry.",
        ),
    ] = None,
    older_than: Annotated[
        float | None,
        typer.Option(
            "--older-than",
            metavar="DAYS",
            callback=lambda value: value if value is None else positive_finite(value),
            help="Remove only entries last used more than DAYS days ago (0.5: 12 hours).",
        ),
    ] = None,
) -> None:
    """Remove entries of the corpus cache: those given, or those unused for --older-than days, or every
    one (the packaged models beside them stay)."""
    from bertology.corpus.cache import clear_cache, corpus_cache_folder

    removed = clear_cache(keys or (), older_than=None if older_than is None else older_than * DAY)
    out.print(f"Removed {len(removed)} entries from {corpus_cache_folder()}.", highlight=False)
    for key in removed:
        out.print(f"  {key}", highlight=False)
