"""The typer application, its global options and the console entry point: user errors become one
sentence on stderr and an exit code.
"""

from __future__ import annotations

import os
import signal
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, TextIO

import typer
from rich.console import Console
from typer.core import TyperCommand, TyperGroup

from bertology.options import MAX_COUNT

#: What pydantic (which parses typer's values) puts before the sentence of a check that failed.
_PYDANTIC_PREFIX = "Value error, "


def flags_as_flags(params: list[Any]) -> list[Any]:
    """``params`` with every flag shown in ``--help`` as a flag, without the ``<bool>`` value it takes
    none of."""
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    return params


class BertologyCommand(TyperCommand):
    """Every ``bertology`` command: its flags are shown as flags in ``--help`` (no ``<bool>`` value), a
    usage error is the sentence of the check that failed (without pydantic's "Value error, "), and no
    whole number is above :data:`~bertology.options.MAX_COUNT` (checked here, so counts need no ``max=``
    that ``--help`` would print as ``[1<=x<=9223372036854775807]``)."""

    def get_params(self, ctx: typer.Context) -> list[Any]:
        return flags_as_flags(super().get_params(ctx))

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        try:
            rest = super().parse_args(ctx, args)
        except typer.BadParameter as error:
            error.message = error.message.removeprefix(_PYDANTIC_PREFIX)
            raise
        for param in self.params:
            value = ctx.params.get(param.name or "")
            if isinstance(value, int) and not isinstance(value, bool) and value > MAX_COUNT:
                raise typer.BadParameter(f"{value} is more than {MAX_COUNT}, the most it takes.", ctx, param)
        return rest


class BertologyGroup(TyperGroup):
    """``bertology`` and its groups of commands (``cache``, ``probe``): flags shown as flags, as in
    :class:`BertologyCommand`."""

    def get_params(self, ctx: typer.Context) -> list[Any]:
        return flags_as_flags(super().get_params(ctx))


class BertologyApp(typer.Typer):
    """The typer application whose commands are :class:`BertologyCommand` s and groups
    :class:`BertologyGroup` s."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cls=BertologyGroup, **kwargs)

    def command(self, *args: Any, **kwargs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        kwargs.setdefault("cls", BertologyCommand)
        return super().command(*args, **kwargs)


app = BertologyApp(
    name="bertology",
    help="See and measure what the attention heads of BERT-family transformers do.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


class State:
    debug = False


def say_model_note(name: str) -> None:
    """What a user should know about the model ``name`` (a quantised file's caveat), as a line on stderr;
    nothing for a model without a note (:func:`~bertology.models.model_store.model_note`)."""
    from bertology.models.model_store import model_note

    if note := model_note(name):
        err.print(f"Note: {note}.", highlight=False)


#: The exit code of a run stopped by Ctrl-C (SIGINT), as shells report it (128 + 2).
INTERRUPTED_EXIT = 130


#: The exit code of a run stopped by SIGTERM (128 + 15).
TERMINATED_EXIT = 143


class Terminated(BaseException):
    """SIGTERM, raised where the command is so that its cleanup runs (staging folders removed, a training
    run marked interrupted) as for Ctrl-C; a BaseException, so ``except Exception`` does not swallow it."""


def _terminate(signum: int, frame: object) -> None:
    raise Terminated


class Interrupted(Exception):
    """A run stopped by Ctrl-C; the message says what was kept (exit code :data:`INTERRUPTED_EXIT`)."""


@contextmanager
def resumable(checkpoint: Path) -> Iterator[None]:
    """Ctrl-C during the block (a Ray run keeping ``checkpoint``) becomes :class:`Interrupted`, saying
    that ``--resume`` continues from the checkpoint the run saved as it stopped."""
    try:
        yield
    except KeyboardInterrupt:
        if not checkpoint.is_file():
            raise Interrupted("stopped by Ctrl-C before any work was saved.") from None
        raise Interrupted(
            f"stopped by Ctrl-C; the work done is kept in {checkpoint}, and the same command with --resume "
            "continues it."
        ) from None


@app.callback()
def _global(
    debug: Annotated[bool, typer.Option("--debug", help="Show full tracebacks on errors.")] = False,
) -> None:
    State.debug = debug


def quiet_libraries() -> None:
    """Only errors from transformers and the hub, no download bars (set for this process before either is
    imported, unless the user set them), and warnings as one yellow line."""
    for name, value in (
        ("TRANSFORMERS_VERBOSITY", "error"),
        ("HF_HUB_VERBOSITY", "error"),
        ("HF_HUB_DISABLE_PROGRESS_BARS", "1"),
    ):
        os.environ.setdefault(name, value)

    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        err.print(f"[yellow]Warning:[/yellow] {message}", highlight=False)

    warnings.showwarning = show


def main() -> None:
    """Console entry point: user errors become one sentence on stderr and exit code 1."""
    from bertology.errors import BertologyError

    quiet_libraries()
    signal.signal(signal.SIGTERM, _terminate)  # the command line's own process: cleanup runs on SIGTERM
    try:
        code = app(standalone_mode=False)
    except Terminated:
        err.print("[red]Terminated:[/red] stopped by SIGTERM; nothing more was written.", highlight=False)
        sys.exit(TERMINATED_EXIT)
    except Interrupted as error:
        err.print(f"[red]Interrupted:[/red] {error}", highlight=False)
        sys.exit(INTERRUPTED_EXIT)
    except BertologyError as error:
        if State.debug:
            raise
        err.print(f"[red]Error:[/red] {error}", highlight=False)
        sys.exit(1)
    except typer.Abort:
        err.print("Aborted.")
        sys.exit(130)
    except OSError as error:  # a file that could not be read or written after the checks up front
        if State.debug:
            raise
        where = f" {error.filename}" if error.filename else ""
        err.print(f"[red]Error:[/red] Could not use{where}: {error.strerror or error}.", highlight=False)
        sys.exit(1)
    except typer.TyperException as error:  # usage errors: an unknown option, a value out of range
        show = getattr(error, "show", None)  # typer's click exceptions print the usage line too
        if show is None:
            err.print(f"[red]Error:[/red] {error.format_message()}", highlight=False)
        else:
            show()
        sys.exit(error.exit_code)
    except MemoryError:
        if State.debug:
            raise
        err.print("[red]Error:[/red] Out of memory; give smaller inputs or a smaller --batch-size.")
        sys.exit(1)
    except Exception as error:  # anything unexpected
        if State.debug:
            raise
        err.print(
            f"[red]Unexpected error:[/red] {type(error).__name__}: {error} (run with --debug for details)"
        )
        sys.exit(2)
    if code == INTERRUPTED_EXIT:  # typer's answer to Ctrl-C (KeyboardInterrupt) outside a Ray run
        err.print("[red]Interrupted:[/red] stopped by Ctrl-C; nothing more was written.", highlight=False)
        sys.exit(INTERRUPTED_EXIT)
