"""`batchpilot runtime fetch URI DEST [URI DEST ...]`: copy a model (and the files that go with
it: a variant, a labels file, a tokenizer) into the pod before the server starts.

The operator runs it as an init container for http(s):// model URIs. It writes to a temporary
file beside DEST and renames it, so the server never sees half a model, and it fails loudly
(non-zero exit, the reason on stderr) on any HTTP error, short read or timeout.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

CHUNK = 1 << 20


def fetch(uri: str, dest: Path, *, timeout_s: float = 60.0) -> int:
    """Copy `uri` (http, https or file) to `dest`; returns the number of bytes written."""
    scheme = urlsplit(uri).scheme
    if scheme not in ("http", "https", "file"):
        raise ValueError(f"cannot fetch {uri}: only http://, https:// and file:// are supported")
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(uri, timeout=timeout_s) as src:
            expected = src.headers.get("Content-Length") if scheme != "file" else None
            shutil.copyfileobj(src, out, CHUNK)
            written = out.tell()
        if expected is not None and int(expected) != written:
            raise OSError(f"short read from {uri}: {written} of {expected} bytes")
        os.replace(tmp, dest)
        return written
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "pairs",
        nargs="+",
        metavar="URI DEST",
        help="http(s):// or file:// URI and where to write it; several pairs fetch several files",
    )
    parser.add_argument("--timeout-s", type=float, default=60.0, help="socket timeout")


def main(args: argparse.Namespace) -> int:
    pairs: list[str] = args.pairs
    if len(pairs) % 2:
        print("batchpilot runtime fetch: give URI DEST pairs", file=sys.stderr)
        return 2
    for uri, dest in zip(pairs[::2], pairs[1::2], strict=True):
        try:
            size = fetch(uri, Path(dest), timeout_s=args.timeout_s)
        except (ValueError, OSError, urllib.error.URLError) as exc:
            print(f"batchpilot runtime fetch: {exc}", file=sys.stderr)
            return 1
        print(f"fetched {uri} to {dest} ({size} bytes)")
    return 0
