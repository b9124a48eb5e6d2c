"""``torchless view PATH [PATH2]``: the artifact (or the diff of two) in the browser."""

from __future__ import annotations

import argparse
import sys

from ..render import echo

__all__ = ["register"]


def cmd_view(args: argparse.Namespace) -> int:
    from ...view import write_html
    from ...view.model import build
    from ...view.server import TensorSource, ViewServer

    paths = [args.path] + ([args.path2] if args.path2 else [])
    kw = {"scan": not args.no_scan, "format": args.format}
    if args.json:
        from ..render import emit_json

        model, arts = build(paths, **kw)
        for a in arts:
            a.close()
        emit_json("view", model)
        return 0
    if args.html:
        dest = write_html(paths, args.html, **kw)
        echo(f"wrote {dest}")
        return 0
    model, arts = build(paths, **kw)
    try:
        server = ViewServer(model, TensorSource(arts), port=args.port)
    except BaseException:
        for a in arts:
            a.close()
        raise
    with server:
        echo(f"torchless view: {server.url}", flush=True)
        echo("press Ctrl-C to stop", file=sys.stderr, flush=True)
        if not args.no_browser:
            import webbrowser

            webbrowser.open(server.url)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "view",
        help="show an artifact (or the diff of two) in the browser",
        description="Serve a viewer of the artifact's tensors, graphs, code and scan findings from 127.0.0.1 "
        "(random port and token) and open the browser; with PATH2, the diff of the two. --html writes one "
        "self-contained HTML file instead (no server, no network).",
    )
    p.add_argument("path", metavar="PATH")
    p.add_argument("path2", metavar="PATH2", nargs="?", default=None, help="a second artifact: show the diff")
    p.add_argument("--port", type=int, default=0, help="port to listen on (default: a random free one)")
    p.add_argument("--no-browser", action="store_true", help="print the URL, do not open a browser")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--html", metavar="OUT.html", help="write a self-contained HTML file instead of serving")
    out.add_argument("--json", action="store_true", help="print the page's data model (tensors, graphs, diff, findings)")
    p.add_argument("--no-scan", action="store_true", help="leave out the security scan's findings")
    p.add_argument("--format", default=None, help="the format of the paths (default: detected)")
    p.set_defaults(func=cmd_view)
