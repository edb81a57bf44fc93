"""The runs folder's routes: ``GET /api/runs`` (every run under it, with its kind) and
``GET /runs/{path}`` (a file of it; a report's folder redirects to its report, a training run's folder
gives its watch page, :mod:`bertology.server.watch_pages`; a page opened in a browser comes inside a
sandboxed frame, :mod:`bertology.server.run_frame`)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response

from bertology.files.beneath import OpenFolder
from bertology.files.run_files import CIRCUIT_PAGE_FILE, REPORT_FILE, TRAINING_FILE
from bertology.server.answers import error_answers
from bertology.server.errors import RequestError, shown
from bertology.server.opened_file import OpenedFileResponse
from bertology.server.page import run_file_policy
from bertology.server.run_frame import frame_page, is_markup, needs_frame
from bertology.server.runs import RunsFolder, folder_url
from bertology.server.schemas import RunEntry, RunList
from bertology.server.watch_pages import WatchPages

_FILE_ANSWERS = {
    200: {"description": "The file, with its own content type.", "content": {"*/*": {}}},
    307: {"description": "A report's folder: to its report.html (a circuit's: to its circuit.html)."},
    **error_answers(
        {
            403: "A path that could reach outside the runs folder, or a page asked for as something other "
            "than a document or its frame.",
            404: "Nothing there.",
            422: "A training run whose files are damaged: the message names the file.",
            503: "Building a training run's page took longer than the timeout.",
        }
    ),
}


def run_routes(folder: RunsFolder | None, watch_pages: WatchPages | None) -> APIRouter:
    """The listing and the files of the runs folder ``folder`` (``None``: no runs folder; the listing is
    empty and the files answer 404); ``watch_pages`` builds a training run's page."""
    router = APIRouter(tags=["runs"])

    @router.get("/api/runs")
    def list_runs() -> RunList:
        """Analysis reports, probe reports and training runs under the runs folder."""
        if folder is None:
            return RunList(root=None, runs=[])
        return RunList(
            root=str(folder.root),
            runs=[
                RunEntry(
                    path=run.path,
                    kind=run.kind,
                    model=run.model,
                    url=run.url,
                    explore=run.explore_url,
                    links=run.links,
                )
                for run in folder.runs()
            ],
        )

    @router.get("/runs/{path:path}", response_class=FileResponse, responses=_FILE_ANSWERS)
    async def run_file(path: str, request: Request) -> Response:
        """A file inside the runs folder; a training run's folder gives its watch page (step slider)."""
        if folder is None or watch_pages is None:
            raise RequestError(404, "This server has no runs folder (start it with --runs DIR).")
        opened = folder.open(path)
        headers = {"Content-Security-Policy": run_file_policy(), "Vary": "Sec-Fetch-Dest"}
        if not isinstance(opened, OpenFolder):
            if is_markup(opened) and needs_frame(request):
                opened.close()
                return frame_page(request)
            return OpenedFileResponse(opened, headers=headers)
        with opened:  # a run.json that is a link is a training run's, refused when its page reads it
            training = opened.stat(TRAINING_FILE) is not None
            report = next((name for name in (REPORT_FILE, CIRCUIT_PAGE_FILE) if opened.is_file(name)), None)
        if training:
            if needs_frame(request):
                return frame_page(request)
            return HTMLResponse(await watch_pages.page(path, request), headers=headers)
        if report:  # to the one address of its report, however the folder's was spelled
            return RedirectResponse(folder_url(opened.label) + report)
        raise RequestError(404, f"There is no report or training run at '{shown(path)}' in the runs folder.")

    return router
