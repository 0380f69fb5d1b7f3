"""A package index on 127.0.0.1 for install tests: a PEP 503 "simple" layout written to a folder
and served by Python's http.server, as a static index on a web server is.

What pip requires of it, as its source states (pip 23, pip/_internal/index/collector.py and
pip/_internal/models/link.py): the project page is `<index>/<canonical name>/` (PEP 503's
normalized name; `_get_index_content` asks for the folder URL and http.server answers with its
index.html), served as text/html (`_ensure_api_response` refuses other content types); each
file is an <a> whose href may be relative to the page and may end with `#sha256=<hex>` (pip
checks the download against it), and whose `data-requires-python` attribute (HTML-escaped)
lets pip skip files for other Pythons (`Link.from_element`). The root page lists the projects.
"""

import contextlib
import hashlib
import html
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request

# packaging (a requirement of TensorFlow), not pip's vendored copy: importing pip in a process
# turns setuptools' distutils shim off, and tests/test_packaging.py imports setuptools later.
from packaging.utils import (
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)


def _project(filename):
    if filename.endswith(".whl"):
        return parse_wheel_filename(filename)[0]
    return parse_sdist_filename(filename)[0]


def write_index(folder, files, requires_python):
    """Writes `files` (wheels and sdists) into `folder` as a PEP 503 index: folder/files/ holds
    them, folder/simple/ the pages; `requires_python` maps a project's canonical name to its
    Requires-Python. Returns the index's path (folder/simple)."""
    store = os.path.join(folder, "files")
    simple = os.path.join(folder, "simple")
    os.makedirs(store, exist_ok=True)
    projects = {}
    for path in files:
        name = os.path.basename(path)
        shutil.copyfile(path, os.path.join(store, name))
        projects.setdefault(canonicalize_name(_project(name)), []).append(name)
    for project, names in projects.items():
        page = os.path.join(simple, project)
        os.makedirs(page, exist_ok=True)
        requires = requires_python.get(project)
        links = []
        for name in sorted(names):
            with open(os.path.join(store, name), "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
            attribute = ' data-requires-python="%s"' % html.escape(requires) if requires else ""
            links.append(
                '<a href="../../files/%s#sha256=%s"%s>%s</a><br/>'
                % (name, digest, attribute, html.escape(name))
            )
        _write_page(os.path.join(page, "index.html"), "Links for " + project, links)
    _write_page(
        os.path.join(simple, "index.html"),
        "Simple index",
        ['<a href="%s/">%s</a><br/>' % (p, p) for p in sorted(projects)],
    )
    return simple


def _write_page(path, title, links):
    with open(path, "w") as f:
        f.write(
            '<!DOCTYPE html>\n<html><head><meta name="pypi:repository-version" '
            'content="1.0"><title>%s</title></head><body>\n%s\n</body></html>\n'
            % (html.escape(title), "\n".join(links))
        )


@contextlib.contextmanager
def serve(folder):
    """Serves `folder` over HTTP on 127.0.0.1 at a port the server picks; yields its URL and
    stops the server on leaving, also on an error."""
    server = subprocess.Popen(
        [
            sys.executable,
            "-u",
            "-m",
            "http.server",
            "0",
            "--bind",
            "127.0.0.1",
            "--directory",
            folder,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = server.stdout.readline()  # Serving HTTP on 127.0.0.1 port N (http://...) ...
        match = re.search(r"port (\d+)", line)
        if not match:
            raise RuntimeError("http.server did not start: %r" % line)
        url = "http://127.0.0.1:%s" % match.group(1)
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(url + "/", timeout=5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield url
    finally:
        server.kill()
        server.wait()
