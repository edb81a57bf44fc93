"""The local web app (``bertology serve``): a page to see the views and per-head statistics of a typed
input, browsing of the reports and training runs in a runs folder, and a JSON API with an OpenAPI
schema, all calling the same library functions as the command line.

A front end: it may import the renderers (views, report) and everything below them; only the command line
imports it.
"""

from bertology.server.app import create_app
from bertology.server.limits import Limits
from bertology.server.serve import serve

__all__ = ["Limits", "create_app", "serve"]
