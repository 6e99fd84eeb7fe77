"""The page `ember serve` answers at ``GET /``: try the loaded model in a browser.

One self-contained HTML document (its CSS and JavaScript inlined, no external scripts, fonts
or images: it works offline), built from the files beside this module and a JSON description
of the model: its summary and, per inference method, the method's ``form`` (the request's
fields and the view that shows the response; ``ember.tasks.inference.methods``). The JavaScript
(``page.js``) is generic: it builds each form from its fields, POSTs the JSON body to the
method's endpoint and renders the response with the view the method names (probability
bars, top-k lists, highlighted entities, the answer marked in its context, continuations, a
similarity matrix, log-likelihoods) or as JSON; an error response shows its message. A new
method appears on the page with its own ``form`` and no change here.
"""

from __future__ import annotations

import json
from importlib import resources

PLACEHOLDERS = ("/*EMBER_CSS*/", "/*EMBER_CONFIG*/", "/*EMBER_JS*/")


def _asset(name: str) -> str:
    return resources.files(__name__).joinpath(name).read_text(encoding="utf-8")


def page_config(predictor, limits=None) -> dict:
    """What the page knows about the model (embedded as JSON in the document)."""
    methods = [{"name": name, "endpoint": f"/{name}", "form": getattr(method, "form", None)}
               for name, method in predictor.methods.items()]
    served = {"max_texts": limits.max_texts, "max_chars": limits.max_chars} if limits is not None else {}
    return {"model": predictor.info.summary(), "backend": predictor.backend, "max_length": predictor.max_length,
            "limits": served, "methods": methods}


def _script_json(value) -> str:
    """JSON that cannot close the <script> element it sits in (or open a comment there)."""
    text = json.dumps(value, ensure_ascii=False)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def render_page(predictor, limits=None) -> str:
    """The whole HTML document for ``predictor``."""
    html = _asset("index.html")
    for placeholder, value in zip(PLACEHOLDERS, (_asset("page.css"), _script_json(page_config(predictor, limits)),
                                                 _asset("page.js"))):
        html = html.replace(placeholder, value, 1)
    return html
