"""A view as a notebook output: its page in a sandboxed ``<iframe srcdoc>``, sent deflated.

Every view page inlines the same 125 kB of JavaScript and CSS, and an ``srcdoc`` attribute escapes the
page's quotes and brackets, so three small views made a 670 kB notebook. The output's ``srcdoc`` is
therefore a small loader page that carries the view page as base64 of its deflated bytes (level 9; the
head view of a pair of 14 tokens: 63 kB instead of 139 kB; a notebook of the head, model and neuron view
of one sentence and a corpus analysis: 273 kB), inflates it with the browser's
``DecompressionStream`` (which the view page itself needs for its data) and writes it into its own
document, under the view page's Content-Security-Policy. A script beside the frame sizes the frame to
the height the page reports with ``postMessage`` (``static/views/boot.js`` ``reportHeight``).
"""

from __future__ import annotations

import base64
import html
import uuid
import zlib

from bertology.views.page import CONTENT_SECURITY_POLICY

#: The tallest a notebook frame grows (px); a taller view scrolls inside it, its header rows sticky.
MAX_FRAME_HEIGHT = 2400

#: The deflate level of a notebook output's page (a few milliseconds for a 300 kB page).
OUTPUT_DEFLATE_LEVEL = 9

# The srcdoc document: inflate the page and replace this document by it (same window, so the frame
# sizer below still hears its messages).
_LOADER = """<!DOCTYPE html><html><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="%(csp)s"></head><body><script>(async () => {
  const bytes = Uint8Array.from(atob("%(page)s"), (char) => char.charCodeAt(0));
  const inflated = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
  const page = await new Response(inflated).text();
  document.open();
  document.write(page);
  document.close();
})();</script></body></html>"""

# Beside the frame: size it to the height its page reports (static/views/boot.js reportHeight), up to
# the cap. The page is sandboxed (no same origin), so only a message can say how tall it is.
_FRAME_SIZER = """<script>(() => {
  const frame = document.getElementById("%(id)s");
  const resize = (event) => {
    if (!frame.isConnected) return removeEventListener("message", resize);
    const height = event.source === frame.contentWindow && Number(event.data && event.data.bertologyHeight);
    if (height > 0) frame.style.height = Math.min(Math.ceil(height), %(cap)d) + "px";
  };
  addEventListener("message", resize);
})();</script>"""


def loader_page(page: str) -> str:
    """The ``srcdoc`` document that shows ``page`` (a whole HTML page): the page deflated, base64."""
    packed = base64.b64encode(zlib.compress(page.encode("utf-8"), OUTPUT_DEFLATE_LEVEL)).decode("ascii")
    return _LOADER % {"csp": CONTENT_SECURITY_POLICY, "page": packed}


def notebook_frame(page: str, height: int) -> str:
    """A notebook output (``_repr_html_``) that shows ``page`` in a sandboxed frame ``height`` px tall at
    first, then as tall as its content (at most :data:`MAX_FRAME_HEIGHT`)."""
    frame_id = f"bertology-{uuid.uuid4().hex}"
    return (
        f'<iframe id="{frame_id}" srcdoc="{html.escape(loader_page(page), quote=True)}" '
        'sandbox="allow-scripts allow-downloads" '
        f'style="width:100%;height:{height}px;border:0" title="bertology view"></iframe>'
    ) + _FRAME_SIZER % {"id": frame_id, "cap": MAX_FRAME_HEIGHT}
