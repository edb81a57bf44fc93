"""``bertology cache list | clear``: the encoded-corpus cache (:mod:`bertology.corpus.cache`)."""

from __future__ import annotations

import datetime

from bertology.cli.app import BertologyApp, app, out

cache_app = BertologyApp(
    help="The encoded-corpus cache: corpora read, segmented and encoded once, kept in "
    "$BERTOLOGY_CACHE/corpora "
    "(or $BERTOLOGY_CORPUS_CACHE) for later runs; at most $BERTOLOGY_CACHE_MB megabytes, least recently "
    "used removed first.",
    no_args_is_help=True,
)
app.add_typer(cache_app, name="cache")


@cache_app.command("list")
def list_entries() -> None:
    """List the cache's entries, least recently used first: key, corpus file, segments, size, last use."""
    from bertology.corpus.cache import MEGABYTE, cache_entries, corpus_cache_folder, limit_bytes

    entries = cache_entries()
    total = sum(entry.bytes for entry in entries)
    for entry in entries:
        used = datetime.datetime.fromtimestamp(entry.used).isoformat(sep=" ", timespec="seconds")
        out.print(
            f"{entry.key}  {entry.corpus}  {entry.segments} segments  {entry.bytes / MEGABYTE:.1f} MB  "
            f"used {used}",
            highlight=False,
        )
    out.print(
        f"{len(entries)} entries, {total / MEGABYTE:.1f} MB of at most {limit_bytes() / MEGABYTE:.0f} MB in "
        f"{corpus_cache_folder()}.",
        highlight=False,
    )


@cache_app.command("clear")
def clear() -> None:
    """Remove every entry of the corpus cache (the packaged models beside it stay)."""
    from bertology.corpus.cache import clear_cache, corpus_cache_folder

    removed = clear_cache()
    out.print(f"Removed {removed} entries from {corpus_cache_folder()}.", highlight=False)
